package agentcall

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"iter"
	"math"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// kind is a JSON value's type.
type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// name is how an error message names the kind, as encoding/json's UnmarshalTypeError does.
func (k kind) name() string {
	return [...]string{"null", "bool", "number", "string", "array", "object"}[k]
}

// node is one JSON value of a body: its span, and for an object member the span of its key
// (quotes excluded). Nodes are in document order; an array's or object's elements follow it, up
// to next, the index after its subtree.
type node struct {
	kind       kind
	start, end int32
	keyStart   int32
	keyEnd     int32
	next       int32
}

// tree is a body read into nodes. The readers of every shape walk a tree, whichever of the two
// builders made it: buildFast, the scanner on every call's path, or buildRef, encoding/json's
// tokenizer, which the fast one falls back to and is tested against.
type tree struct {
	body  []byte
	nodes []node
	// keys holds the decoded keys that contain escapes (buildRef only: buildFast gives up on
	// them), by node index.
	keys map[int32]string
}

// maxDepth bounds the fast scanner's recursion; deeper bodies go to buildRef (encoding/json
// allows 10000 levels).
const maxDepth = 512

// buildFast scans a body in one pass, validating it as encoding/json does, into a tree. ok is false
// for invalid JSON and for the few valid bodies it leaves to buildRef: keys with escapes, nesting
// deeper than maxDepth, bodies of 2 GiB or more.
func buildFast(body []byte) (t *tree, ok bool) {
	if len(body) >= math.MaxInt32 {
		return nil, false
	}
	s := scanner{b: body, nodes: make([]node, 0, 16+len(body)/64)}
	i, ok := s.value(skipSpace(body, 0), -1, -1, 0)
	if !ok || skipSpace(body, i) != len(body) {
		return nil, false
	}
	return &tree{body: body, nodes: s.nodes}, true
}

type scanner struct {
	b     []byte
	nodes []node
}

// value scans the value at b[i] into a node (with the key span ks, ke when it is a member's) and
// returns the index after it.
func (s *scanner) value(i int, ks, ke int32, depth int) (int, bool) {
	b := s.b
	if i >= len(b) || depth > maxDepth {
		return i, false
	}
	self := len(s.nodes)
	s.nodes = append(s.nodes, node{start: int32(i), keyStart: ks, keyEnd: ke})
	var k kind
	var ok bool
	end := i
	switch c := b[i]; {
	case c == '"':
		k = kindString
		end, ok = stringEnd(b, i)
	case c == '{':
		k = kindObject
		end, ok = s.object(i, depth)
	case c == '[':
		k = kindArray
		end, ok = s.array(i, depth)
	case c == 't':
		k, end, ok = kindBool, i+4, bytes.HasPrefix(b[i:], []byte("true"))
	case c == 'f':
		k, end, ok = kindBool, i+5, bytes.HasPrefix(b[i:], []byte("false"))
	case c == 'n':
		k, end, ok = kindNull, i+4, bytes.HasPrefix(b[i:], []byte("null"))
	case c == '-' || '0' <= c && c <= '9':
		k = kindNumber
		end, ok = numberEnd(b, i)
	}
	if !ok {
		return end, false
	}
	n := &s.nodes[self]
	n.kind, n.end, n.next = k, int32(end), int32(len(s.nodes))
	return end, true
}

func (s *scanner) object(i, depth int) (int, bool) {
	return s.seq(i, '}', func(i int) (int, bool) {
		b := s.b
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		ks := i + 1
		ke, ok := stringEnd(b, i)
		if !ok || bytes.IndexByte(b[i:ke], '\\') >= 0 {
			return ke, false
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		return s.value(skipSpace(b, i+1), int32(ks), int32(ke-1), depth+1)
	})
}

func (s *scanner) array(i, depth int) (int, bool) {
	return s.seq(i, ']', func(i int) (int, bool) { return s.value(i, -1, -1, depth+1) })
}

// seq scans the items of the array or object whose opening bracket is b[i], each with item (an
// element, or a member), separated by commas up to the closing bracket.
func (s *scanner) seq(i int, closing byte, item func(i int) (int, bool)) (int, bool) {
	b := s.b
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closing {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = item(i); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case closing:
			return i + 1, true
		default:
			return i, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd validates the string literal at b[i] (b[i] is its quote) and returns the index after
// it: no control characters, only JSON's escapes. Bytes of invalid UTF-8 are valid, as
// encoding/json takes them (each decodes to U+FFFD).
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c < ' ':
			return j, false
		case c == '\\':
			if j+1 >= len(b) {
				return j, false
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+5 >= len(b) || hex4(b[j+2:j+6]) < 0 {
					return j, false
				}
				j += 5
			default:
				return j, false
			}
		}
	}
	return len(b), false
}

// numberEnd validates the number at b[i] by JSON's grammar and returns the index after it.
func numberEnd(b []byte, i int) (int, bool) {
	digits := func(i int) (int, bool) {
		j := i
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		return j, j > i
	}
	if b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else {
		var ok bool
		if i, ok = digits(i); !ok {
			return i, false
		}
	}
	if i < len(b) && b[i] == '.' {
		var ok bool
		if i, ok = digits(i + 1); !ok {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		var ok bool
		if i, ok = digits(i); !ok {
			return i, false
		}
	}
	return i, true
}

// hex4 decodes the four hexadecimal digits of a \u escape; -1 if they are not.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// buildRef reads a body into a tree with encoding/json's tokenizer: the reference buildFast falls
// back to and is tested against. The error is encoding/json's for a body that is not JSON.
func buildRef(body []byte) (*tree, error) {
	if !json.Valid(body) || len(body) >= math.MaxInt32 {
		var v any
		err := json.Unmarshal(body, &v)
		if err == nil {
			err = errors.New("body of 2 GiB or more")
		}
		return nil, err
	}
	r := refBuilder{t: &tree{body: body}, dec: json.NewDecoder(bytes.NewReader(body))}
	r.dec.UseNumber()
	if err := r.value(-1, -1); err != nil {
		return nil, err
	}
	return r.t, nil
}

type refBuilder struct {
	t   *tree
	dec *json.Decoder
}

// start is where the token the decoder returns next begins: between tokens of a valid body there
// are only spaces and the separators ':' and ','.
func (r *refBuilder) start() int32 {
	b, i := r.t.body, int(r.dec.InputOffset())
	for i < len(b) && (b[i] == ':' || b[i] == ',' || skipSpace(b, i) != i) {
		i++
	}
	return int32(i)
}

func (r *refBuilder) value(ks, ke int32) error {
	start := r.start()
	tok, err := r.dec.Token()
	if err != nil {
		return err
	}
	self := int32(len(r.t.nodes))
	r.t.nodes = append(r.t.nodes, node{start: start, keyStart: ks, keyEnd: ke})
	var k kind
	switch v := tok.(type) {
	case nil:
		k = kindNull
	case bool:
		k = kindBool
	case json.Number:
		k = kindNumber
	case string:
		k = kindString
	case json.Delim:
		if v == '[' {
			k = kindArray
			for r.dec.More() {
				if err := r.value(-1, -1); err != nil {
					return err
				}
			}
		} else {
			k = kindObject
			for r.dec.More() {
				kstart := r.start()
				key, err := r.dec.Token()
				if err != nil {
					return err
				}
				kend := int32(r.dec.InputOffset())
				if bytes.IndexByte(r.t.body[kstart:kend], '\\') >= 0 {
					if r.t.keys == nil {
						r.t.keys = map[int32]string{}
					}
					r.t.keys[int32(len(r.t.nodes))] = key.(string)
				}
				if err := r.value(kstart+1, kend-1); err != nil {
					return err
				}
			}
		}
		if _, err := r.dec.Token(); err != nil { // the closing delimiter
			return err
		}
	}
	n := &r.t.nodes[self]
	n.kind, n.end, n.next = k, int32(r.dec.InputOffset()), int32(len(r.t.nodes))
	return nil
}

// raw is the JSON text of node i.
func (t *tree) raw(i int32) []byte {
	n := &t.nodes[i]
	return t.body[n.start:n.end]
}

// key is the key of member node i: decoded when it has escapes, else as sent (invalid UTF-8 is
// left as is: the readers' keys are ASCII, which such a key matches neither way). It does not
// allocate for a key without escapes when compared at once.
func (t *tree) key(i int32) []byte {
	if k, ok := t.keys[i]; ok {
		return []byte(k)
	}
	n := &t.nodes[i]
	return t.body[n.keyStart:n.keyEnd]
}

// str decodes string node i as encoding/json does (invalid UTF-8 as U+FFFD).
func (t *tree) str(i int32) string {
	lit := t.raw(i)
	s := lit[1 : len(lit)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s)
	}
	var v string
	_ = json.Unmarshal(lit, &v) // a validated literal: cannot fail
	return v
}

// runes is the number of characters of string node i once decoded, counted without decoding it.
func (t *tree) runes(i int32) int {
	return jsonStringRunes(t.raw(i))
}

// jsonStringRunes counts the characters of the string a valid JSON string literal decodes to, as
// utf8.RuneCountInString would after json.Unmarshal: each escape is one character, but for a
// valid UTF-16 surrogate pair, also one; each byte of invalid UTF-8 is one (encoding/json turns it
// into U+FFFD, utf8.RuneCount counts it as one), as is a lone surrogate (U+FFFD).
func jsonStringRunes(lit []byte) int {
	s := lit[1 : len(lit)-1]
	// Every byte of an escape is ASCII, so one runeCount of the literal counts each escape as its
	// length; each escape then gives back all but one. One pass over the text, not one call per
	// run between escapes (code is full of \n and \").
	n := runeCount(s)
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return n
		}
		if s[i+1] != 'u' {
			n-- // \X: two bytes, one character
			s = s[i+2:]
			continue
		}
		n -= 5 // \uXXXX: six bytes, one character
		r := hex4(s[i+2 : i+6])
		s = s[i+6:]
		if utf16.IsSurrogate(r) && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' &&
			utf16.DecodeRune(r, hex4(s[2:6])) != unicode.ReplacementChar {
			n -= 6 // the pair's second half is the same character
			s = s[6:]
		}
	}
}

// members yields the elements of array node i, or the members of object node i, in document
// order.
func (t *tree) members(i int32) iter.Seq[int32] {
	return func(yield func(int32) bool) {
		for c := i + 1; c < t.nodes[i].next; c = t.nodes[c].next {
			if !yield(c) {
				return
			}
		}
	}
}

// runeCount is utf8.RuneCount (an invalid byte counts as one character) without its allocation:
// utf8.RuneCount converts the rest of a slice to a string at its first non-ASCII byte, which the
// compiler cannot keep on the stack, so on a body with any non-ASCII text every count copied it.
// ASCII is skipped eight bytes at a time.
func runeCount(p []byte) int {
	const hi = 0x8080808080808080
	n, i := 0, 0
	for i < len(p) {
		if i+8 <= len(p) && binary.LittleEndian.Uint64(p[i:])&hi == 0 {
			i += 8
			n += 8
			continue
		}
		if p[i] < utf8.RuneSelf {
			i++
		} else {
			_, size := utf8.DecodeRune(p[i:])
			i += size
		}
		n++
	}
	return n
}
