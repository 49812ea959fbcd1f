package tools

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/tools/toolstest"
)

// builtins are this package's tools, by name.
func builtins() map[string]Tool {
	out := map[string]Tool{}
	for _, t := range append(FileTools(), CurrentTime(), Execute(ExecuteConfig{})) {
		out[t.Spec().Name] = t
	}
	return out
}

// The generated schemas accept what the hand-written ones did
// (testdata/schemas_before.json is what the model saw before): the same
// properties, types, required names, enums and bounds. A change here is
// a change of what every model is told, so it must be deliberate.
func TestBuiltinSchemasMatchBefore(t *testing.T) {
	raw, err := os.ReadFile("testdata/schemas_before.json")
	if err != nil {
		t.Fatal(err)
	}
	var before map[string]json.RawMessage
	if err := json.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	got := builtins()
	if len(got) != len(before) {
		t.Fatalf("%d built-in tools, %d recorded", len(got), len(before))
	}
	for name, b := range before {
		tl := got[name]
		if tl == nil {
			t.Errorf("%s is gone", name)
			continue
		}
		if d := toolstest.SameShape(b, tl.Spec().Parameters); d != "" {
			t.Errorf("%s's schema changed:\n%s", name, d)
		}
	}
}

// Every built-in's schema accepts an example of its arguments, which
// decodes into its Go struct and back unchanged.
func TestBuiltinSchemasDecodeExamples(t *testing.T) {
	examples := map[string]struct {
		args    string
		decoded any
	}{
		ToolLs:         {`{"path":"/uploads"}`, lsArgs{}},
		ToolReadFile:   {`{"path":"/a.md","offset":3,"limit":10}`, readFileArgs{}},
		ToolWriteFile:  {`{"path":"/a.md","content":"hello"}`, writeFileArgs{}},
		ToolEditFile:   {`{"path":"/a.md","old_string":"a","new_string":"b","replace_all":true}`, editFileArgs{}},
		ToolGlob:       {`{"pattern":"**/*.md","path":"/notes"}`, globArgs{}},
		ToolGrep:       {`{"pattern":"TODO","path":"/","glob":"*.go","output_mode":"count","case_insensitive":true}`, grepArgs{}},
		ToolExecute:    {`{"command":"ls","timeout_seconds":5}`, executeArgs{}},
		"current_time": {`{"timezone":"Europe/Paris"}`, currentTimeArgs{}},
	}
	for name, tl := range builtins() {
		ex, ok := examples[name]
		if !ok {
			t.Errorf("%s has no example", name)
			continue
		}
		toolstest.CheckExample(t, name, tl.Spec().Parameters, ex.args, ex.decoded)
	}
}

type schemaProbe struct {
	Name  string   `json:"name" jsonschema:"who"`
	Mode  string   `json:"mode,omitempty" schema:"enum=a|b"`
	Count *int     `json:"count,omitempty" schema:"minimum=1,maximum=9"`
	Tags  []string `json:"tags,omitempty"`
	filePathAlias
}

func TestSchemaTags(t *testing.T) {
	s := string(SchemaJSON[schemaProbe]())
	for _, want := range []string{
		`"name":{"type":"string","description":"who"}`,
		`"mode":{"type":"string","enum":["a","b"]}`,
		`"count":{"type":"integer","minimum":1,"maximum":9}`,
		`"tags":{"type":"array","items":{"type":"string"}}`,
		`"required":["name"]`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("no %s in %s", want, s)
		}
	}
	if strings.Contains(s, "file_path") || strings.Contains(s, "null") {
		t.Errorf("hidden field or null type in %s", s)
	}
	// The schema refuses what the tags exclude.
	toolstest.CheckExample(t, "probe", json.RawMessage(s), `{"name":"x","mode":"a","count":2,"tags":["t"]}`, schemaProbe{})
}

func TestSchemaRefusesUnknownKeyword(t *testing.T) {
	type bad struct {
		X string `json:"x" schema:"pattern=.*"`
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "unknown schema keyword") {
			t.Fatalf("recovered %v", r)
		}
	}()
	Schema[bad]()
}
