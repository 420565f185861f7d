package agentcall

import (
	"testing"

	"github.com/basin-dev/basin/test/agentbody"
)

// BenchmarkParseRead reads a 300 KB agent conversation with Read (the scanner) and through
// encoding/json's tokenizer (the fallback), side by side.
func BenchmarkParseRead(b *testing.B) {
	body := agentbody.Chat(300 << 10)
	for _, bc := range []struct {
		name string
		read func() (Call, error)
	}{
		{"fast", func() (Call, error) { return Read(Chat, body) }},
		{"fallback", func() (Call, error) {
			t, err := buildRef(body)
			if err != nil {
				return Call{}, err
			}
			return readTree(Chat, t)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if c, err := bc.read(); err != nil || c.Prompt < 1000 {
					b.Fatalf("prompt %d, error %v", c.Prompt, err)
				}
			}
		})
	}
}

// BenchmarkReadShapes reads the same 300 KB agent conversation written for each API, side by
// side: the Responses and Messages readers must keep up with chat's.
func BenchmarkReadShapes(b *testing.B) {
	for _, bc := range []struct {
		shape Shape
		body  []byte
	}{
		{Chat, agentbody.Chat(300 << 10)},
		{Responses, agentbody.Responses(300 << 10)},
		{Messages, agentbody.Messages(300 << 10)},
	} {
		b.Run(bc.shape.String(), func(b *testing.B) {
			if _, ok := buildFast(bc.body); !ok {
				b.Fatal("the body leaves the fast path")
			}
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if c, err := Read(bc.shape, bc.body); err != nil || c.Prompt < 1000 {
					b.Fatalf("prompt %d, error %v", c.Prompt, err)
				}
			}
		})
	}
}
