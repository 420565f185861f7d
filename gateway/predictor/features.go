package predictor

import (
	"math"
	"slices"
	"unicode"
	"unicode/utf8"
)

// 64-bit FNV-1a, written inline rather than through hash/fnv so that a word is hashed rune by rune
// as it is lowercased, with no allocation.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime }

// Term is one distinct word of a task text.
type Term struct {
	// Hash is the 64-bit FNV-1a hash of the lowercased word's UTF-8 bytes. A model maps it to a
	// bucket and a sign with its own Dim, so Features do not depend on the model.
	Hash uint64
	// Count is how many times the term occurs in the text.
	Count int
}

// Features is what a predictor knows of a session before it runs.
type Features struct {
	// Terms are the distinct terms of the task text in order of Hash; empty when there is no text.
	Terms []Term
	// TaskChars is the length of the task text in characters.
	TaskChars int
	// FirstPrompt is the first call's prompt length in tokens.
	FirstPrompt int
}

// Extract computes the features of a session from its task text, the text's length in characters
// and its first prompt in tokens. taskChars is separate from the text because traces record the
// length and never the text; when taskChars is not positive and there is text, the text's length
// in runes is used instead. Negative lengths count as 0. The cost is linear in the text's length.
func Extract(taskText string, taskChars, firstPrompt int) Features {
	if taskChars <= 0 {
		taskChars = utf8.RuneCountInString(taskText)
	}
	return Features{
		Terms:       terms(taskText),
		TaskChars:   taskChars,
		FirstPrompt: max(firstPrompt, 0),
	}
}

// terms hashes every word of text and counts each distinct hash.
func terms(text string) []Term {
	if text == "" {
		return nil
	}
	// Room for a 500-word task on the stack; longer texts grow it on the heap.
	var buf [512]uint64
	hashes := buf[:0]
	var (
		h      uint64 = fnvOffset // hash of the word being read
		inWord bool
		enc    [utf8.UTFMax]byte
	)
	for _, r := range text {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			if inWord {
				hashes = append(hashes, h)
				h, inWord = fnvOffset, false
			}
			continue
		}
		inWord = true
		r = unicode.ToLower(r)
		if r < utf8.RuneSelf {
			h = fnvByte(h, byte(r))
			continue
		}
		n := utf8.EncodeRune(enc[:], r)
		for _, b := range enc[:n] {
			h = fnvByte(h, b)
		}
	}
	if inWord {
		hashes = append(hashes, h)
	}
	if len(hashes) == 0 {
		return nil
	}
	slices.Sort(hashes)
	out := make([]Term, 0, len(hashes))
	for _, h := range hashes {
		if n := len(out); n > 0 && out[n-1].Hash == h {
			out[n-1].Count++
			continue
		}
		out = append(out, Term{Hash: h, Count: 1})
	}
	return out
}

// slot is one nonzero hashed bucket: the signed sum of 1+ln(tf) of the terms that fall in it.
type slot struct {
	bucket int
	value  float64
}

// buckets maps terms to dim buckets, merging collisions, in order of bucket. Buckets whose terms
// cancel exactly are dropped. The result is appended to dst.
func buckets(dst []slot, ts []Term, dim int) []slot {
	start := len(dst)
	for _, t := range ts {
		v := 1 + math.Log(float64(t.Count))
		if t.Hash>>63 == 1 {
			v = -v
		}
		dst = append(dst, slot{bucket: int(t.Hash % uint64(dim)), value: v})
	}
	s := dst[start:]
	slices.SortFunc(s, func(a, b slot) int { return a.bucket - b.bucket })
	out := s[:0]
	for _, x := range s {
		if n := len(out); n > 0 && out[n-1].bucket == x.bucket {
			out[n-1].value += x.value
			continue
		}
		out = append(out, x)
	}
	merged := out[:0]
	for _, x := range out {
		if x.value != 0 {
			merged = append(merged, x)
		}
	}
	return dst[:start+len(merged)]
}

// dense gives the two length features before standardisation.
func dense(f Features) [numDense]float64 {
	return [numDense]float64{
		math.Log1p(float64(max(f.TaskChars, 0))),
		math.Log1p(float64(max(f.FirstPrompt, 0))),
	}
}
