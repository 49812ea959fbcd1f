package tools

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Schema generates the JSON schema of a tool's arguments from the Go
// struct Args, so the schema the model sees and the struct the arguments
// are decoded into cannot drift apart. Every tool with a Go argument
// struct uses it: the built-in tools and natsagent.NewTool.
//
// The tags of Args say what the schema says:
//   - `json:"name"` names a property; a field without omitempty (or
//     omitzero) is required.
//   - `jsonschema:"text"` is the property's description.
//   - `schema:"..."` adds keywords, comma-separated: enum=a|b|c,
//     minimum=N, maximum=N, and "-" to leave a field out of the schema
//     (an alias the tool still accepts but does not advertise).
//
// A pointer or slice field is optional data, not a nullable one: its
// property has the plain type ("integer", not ["null","integer"]).
// Schema panics when no schema can be generated: a mistake in the
// program, found when the tool is built.
func Schema[Args any]() *jsonschema.Schema {
	t := reflect.TypeFor[Args]()
	s, err := SchemaOf(t)
	if err != nil {
		panic(fmt.Sprintf("tools.Schema[%s]: %v", t, err))
	}
	return s
}

// SchemaJSON is Schema marshalled, as a ToolSpec's Parameters.
func SchemaJSON[Args any]() json.RawMessage { return MarshalSchema(Schema[Args]()) }

// MarshalSchema marshals a schema built by Schema (and perhaps edited:
// an enum known only at run time); it panics on a schema that cannot be
// marshalled, which Schema never builds.
func MarshalSchema(s *jsonschema.Schema) json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("tools.MarshalSchema: %v", err))
	}
	return b
}

// SchemaOf is Schema for a type known at run time, returning the error
// instead of panicking.
func SchemaOf(t reflect.Type) (*jsonschema.Schema, error) {
	s, err := jsonschema.ForType(t, nil)
	if err != nil {
		return nil, err
	}
	if err := applyTags(t, s); err != nil {
		return nil, err
	}
	return s, nil
}

// applyTags walks t alongside its generated schema s: it drops the
// "null" that pointers and slices add and applies `schema` tags.
func applyTags(t reflect.Type, s *jsonschema.Schema) error {
	if s == nil {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	notNull(s)
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return applyTags(t.Elem(), s.Items)
	case reflect.Map:
		return applyTags(t.Elem(), s.AdditionalProperties)
	case reflect.Struct:
	default:
		return nil
	}
	for _, f := range reflect.VisibleFields(t) {
		if f.Anonymous || !f.IsExported() {
			continue
		}
		name := jsonName(f)
		if name == "" {
			continue
		}
		prop := s.Properties[name]
		if prop == nil {
			continue
		}
		if err := applyTags(f.Type, prop); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		tag, ok := f.Tag.Lookup("schema")
		if !ok {
			continue
		}
		for _, kw := range strings.Split(tag, ",") {
			key, val, _ := strings.Cut(strings.TrimSpace(kw), "=")
			switch key {
			case "-":
				delete(s.Properties, name)
				s.PropertyOrder = deleteString(s.PropertyOrder, name)
				s.Required = deleteString(s.Required, name)
			case "enum":
				prop.Enum = nil
				for _, v := range strings.Split(val, "|") {
					prop.Enum = append(prop.Enum, v)
				}
			case "minimum", "maximum":
				n, err := strconv.ParseFloat(val, 64)
				if err != nil {
					return fmt.Errorf("%s: %s=%q is not a number", name, key, val)
				}
				if key == "minimum" {
					prop.Minimum = &n
				} else {
					prop.Maximum = &n
				}
			default:
				return fmt.Errorf("%s: unknown schema keyword %q (enum, minimum, maximum or -)", name, key)
			}
		}
	}
	return nil
}

// notNull turns ["null", T] into T.
func notNull(s *jsonschema.Schema) {
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
}

func jsonName(f reflect.StructField) string {
	tag := f.Tag.Get("json")
	if tag == "-" {
		return ""
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name
}

func deleteString(list []string, s string) []string {
	out := list[:0:0]
	for _, v := range list {
		if v != s {
			out = append(out, v)
		}
	}
	return out
}
