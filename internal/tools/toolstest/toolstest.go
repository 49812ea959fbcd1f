// Package toolstest holds the checks the tests of tool packages share:
// a schema compared with the one the model saw before, and a tool's
// example arguments against its schema and its Go argument struct.
package toolstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
)

// shape is what a schema says about the data, without the prose.
type shape struct {
	Type       any               `json:"type,omitempty"`
	Properties map[string]*shape `json:"properties,omitempty"`
	Required   []string          `json:"required,omitempty"`
	Enum       []any             `json:"enum,omitempty"`
	Items      *shape            `json:"items,omitempty"`
	Minimum    *float64          `json:"minimum,omitempty"`
	Maximum    *float64          `json:"maximum,omitempty"`
}

func (s *shape) normalize() {
	if s == nil {
		return
	}
	slices.Sort(s.Required)
	for _, p := range s.Properties {
		p.normalize()
	}
	s.Items.normalize()
}

// SameShape reports how two schemas differ in what they accept: the
// same properties, types, required properties, enums, items and
// bounds; descriptions and additionalProperties may differ. It returns
// "" when they agree.
func SameShape(before, after json.RawMessage) string {
	var a, b shape
	if err := json.Unmarshal(before, &a); err != nil {
		return fmt.Sprintf("before: %v", err)
	}
	if err := json.Unmarshal(after, &b); err != nil {
		return fmt.Sprintf("after: %v", err)
	}
	a.normalize()
	b.normalize()
	if reflect.DeepEqual(a, b) {
		return ""
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return fmt.Sprintf("before %s\nafter  %s", ja, jb)
}

// CheckExample fails t unless example is valid under schema, decodes
// into a new value of args' type with no field left over, and encodes
// back to the same JSON: the schema and the struct agree on every name
// the example uses.
func CheckExample(t *testing.T, name string, schema json.RawMessage, example string, args any) {
	t.Helper()
	var s jsonschema.Schema
	if err := json.Unmarshal(schema, &s); err != nil {
		t.Fatalf("%s: schema: %v", name, err)
	}
	r, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("%s: resolve: %v", name, err)
	}
	var instance any
	if err := json.Unmarshal([]byte(example), &instance); err != nil {
		t.Fatalf("%s: example: %v", name, err)
	}
	if err := r.Validate(instance); err != nil {
		t.Errorf("%s: the example %s breaks the schema: %v", name, example, err)
	}
	v := reflect.New(reflect.TypeOf(args))
	dec := json.NewDecoder(bytes.NewReader([]byte(example)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v.Interface()); err != nil {
		t.Errorf("%s: the example %s does not decode into %T: %v", name, example, args, err)
		return
	}
	back, err := json.Marshal(v.Interface())
	if err != nil {
		t.Fatal(err)
	}
	var got any
	_ = json.Unmarshal(back, &got)
	if !reflect.DeepEqual(got, instance) {
		t.Errorf("%s: the example %s decodes and encodes back as %s", name, example, back)
	}
}
