package confref

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/internal/yamlconf"
)

func page(t *testing.T) (generated, onDisk []byte) {
	t.Helper()
	root, module, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	generated, err = Page(root, module)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err = os.ReadFile(filepath.Join(root, filepath.FromSlash(DocPath)))
	if err != nil {
		t.Fatalf("%v: run `%s`", err, Command)
	}
	return generated, onDisk
}

func TestDocUpToDate(t *testing.T) {
	generated, onDisk := page(t)
	if string(generated) != string(onDisk) {
		g, d := strings.Split(string(generated), "\n"), strings.Split(string(onDisk), "\n")
		for i := range max(len(g), len(d)) {
			var gl, dl string
			if i < len(g) {
				gl = g[i]
			}
			if i < len(d) {
				dl = d[i]
			}
			if gl != dl {
				t.Fatalf("%s is out of date: run `%s` (first difference at line %d:\n have %q\n want %q)",
					DocPath, Command, i+1, dl, gl)
			}
		}
	}
}

// TestEveryKeyDocumented: each key the YAML decoder accepts has a row with a meaning, so a new
// config field without a doc comment fails here.
func TestEveryKeyDocumented(t *testing.T) {
	_, onDisk := page(t)
	rows := map[string]string{}
	for line := range strings.Lines(string(onDisk)) {
		cells := strings.Split(strings.TrimSpace(line), " | ")
		if len(cells) != 4 || !strings.HasPrefix(cells[0], "| `") {
			continue
		}
		key := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		rows[key] = strings.TrimSpace(strings.TrimSuffix(cells[3], "|"))
	}
	for _, c := range []struct {
		name string
		cfg  any
	}{{"gateway", gateway.Config{}}, {"daemon", daemon.Config{}}} {
		for _, k := range yamlconf.Keys(c.cfg) {
			m, ok := rows[k]
			switch {
			case !ok:
				t.Errorf("%s config key %s is missing from %s: run `%s`", c.name, k, DocPath, Command)
			case m == "":
				t.Errorf("%s config key %s has no meaning: give its struct field a doc comment, then run `%s`", c.name, k, Command)
			}
		}
	}
}

func TestRender(t *testing.T) {
	type inner struct{ A int }
	for _, c := range []struct {
		key       string
		v         any
		typ, want string
	}{
		{"listen", "127.0.0.1:8080", "string", "`127.0.0.1:8080`"},
		{"token_file", "", "string", "—"},
		{"dry_run", false, "bool", "`false`"},
		{"tenant_quota", 0, "integer", "—"},
		{"max_body_bytes", int64(16 << 20), "integer", "`16777216` (16 MiB)"},
		{"clock_speed", 1.0, "number", "`1`"},
		{"step", 0.05, "number", "`0.05`"},
		{"interval", yamlconf.Duration(5 * time.Second), "duration", "`5s`"},
		{"shed_window", 15 * time.Minute, "duration", "`15m0s`"},
		{"min_dwell", time.Duration(0), "duration", "—"},
		{"upstreams", []string{"a", "b"}, "list of strings", "`a`, `b`"},
		{"command", []string(nil), "list of strings", "—"},
		{"quotas", map[string]int{"b": 2, "a": 1}, "map of string to integer", "`a: 1`, `b: 2`"},
		{"targets", []inner{}, "list of objects", "—"},
		{"admission", inner{}, "object", "—"},
	} {
		v := reflect.ValueOf(c.v)
		if got := TypeName(v.Type()); got != c.typ {
			t.Errorf("TypeName(%s %T) = %q, want %q", c.key, c.v, got, c.typ)
		}
		if got := Render(c.key, v); got != c.want {
			t.Errorf("Render(%s %#v) = %q, want %q", c.key, c.v, got, c.want)
		}
	}
}

func TestMeaningText(t *testing.T) {
	for _, c := range []struct{ doc, name, want string }{
		{"Listen is the address", "Listen", "the address"},
		{"Upstreams are the URLs", "Upstreams", "the URLs"},
		{"ReferenceBudgetTokens: admission engages", "ReferenceBudgetTokens", "admission engages"},
		{"Listener is something else", "Listen", "Listener is something else"},
	} {
		if got := dropSubject(c.doc, c.name); got != c.want {
			t.Errorf("dropSubject(%q, %q) = %q, want %q", c.doc, c.name, got, c.want)
		}
	}
	if got := Cell("a | b\nc"); got != `a \| b c` {
		t.Errorf("Cell = %q", got)
	}
	if got := capitalize("r in p"); got != "r in p" {
		t.Errorf("capitalize = %q", got)
	}
	if got := capitalize("the address"); got != "The address" {
		t.Errorf("capitalize = %q", got)
	}
}
