package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkTree walks a parsed YAML document against the shape of out's type
// and reports every key that is not a field and every value that cannot
// be one, each with its YAML path and line ("nats.replicaz (line 3):
// unknown key; did you mean replicas?"), in words rather than Go types.
// It removes what it reported from the tree, so the rest decodes and
// validates and a person sees every mistake of the file at once.
func checkTree(doc *yaml.Node, t reflect.Type) []string {
	c := &treeCheck{}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		if !c.value(doc.Content[0], t, "") {
			// The root is not a mapping: reported, and nothing of it
			// decodes, so the document goes (a root cannot be dropped
			// from its parent the way a key is).
			doc.Content = nil
		}
	}
	return c.problems
}

type treeCheck struct {
	problems []string
}

func (c *treeCheck) bad(n *yaml.Node, path, format string, args ...any) {
	if path == "" {
		path = "the file"
	}
	c.problems = append(c.problems, fmt.Sprintf("%s (line %d): %s", path, n.Line, fmt.Sprintf(format, args...)))
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// value checks n as a value of type t; false means it reported n and n
// must go.
func (c *treeCheck) value(n *yaml.Node, t reflect.Type, path string) bool {
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return true
		}
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return true
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return c.decodes(n, t, path)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return c.value(n, t.Elem(), path)
	case reflect.Interface:
		return true
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.bad(n, path, "must be a mapping of %s, not %s", strings.Join(fieldNames(t), ", "), describe(n))
			return false
		}
		fields := fieldTypes(t)
		c.pairs(n, path, func(key *yaml.Node, val *yaml.Node, sub string) bool {
			ft, ok := fields[key.Value]
			if !ok {
				if near := nearest(key.Value, fieldNames(t)); near != "" {
					c.bad(key, sub, "unknown key; did you mean %s?", near)
				} else {
					c.bad(key, sub, "unknown key; the keys here are %s", strings.Join(fieldNames(t), ", "))
				}
				return false
			}
			return c.value(val, ft, sub)
		})
		return true
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			c.bad(n, path, "must be a mapping, not %s", describe(n))
			return false
		}
		c.pairs(n, path, func(key *yaml.Node, val *yaml.Node, sub string) bool {
			return c.value(val, t.Elem(), sub)
		})
		return true
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.bad(n, path, "must be a list, not %s", describe(n))
			return false
		}
		kept := n.Content[:0:0]
		for i, item := range n.Content {
			if c.value(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)) {
				kept = append(kept, item)
			}
		}
		n.Content = kept
		return true
	default:
		return c.decodes(n, t, path)
	}
}

// pairs checks each key and value of a mapping with check and drops the
// pairs it reported.
func (c *treeCheck) pairs(n *yaml.Node, path string, check func(key, val *yaml.Node, sub string) bool) {
	kept := n.Content[:0:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		sub := key.Value
		if path != "" {
			sub = path + "." + key.Value
		}
		if check(key, val, sub) {
			kept = append(kept, key, val)
		}
	}
	n.Content = kept
}

// decodes reports whether n decodes as a t, and says why not in words.
func (c *treeCheck) decodes(n *yaml.Node, t reflect.Type, path string) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		c.bad(n, path, "must be %s, not %s", kindName(t), describe(n))
	} else {
		c.bad(n, path, "%v", err)
	}
	return false
}

// kindName says what a value of t is in a person's words.
func kindName(t reflect.Type) string {
	if t == reflect.TypeFor[Duration]() {
		return "a duration (30s, 5m, 1h)"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "another kind of value"
}

// describe names what a node holds.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return fmt.Sprintf("%q", v)
}

// fieldTypes maps a struct's YAML keys to their types.
func fieldTypes(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		if name, ok := yamlName(t.Field(i)); ok {
			out[name] = t.Field(i).Type
		}
	}
	return out
}

// fieldNames lists a struct's YAML keys in declaration order.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if name, ok := yamlName(t.Field(i)); ok {
			out = append(out, name)
		}
	}
	return out
}

func yamlName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("yaml")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, true
}

// nearest is the candidate closest to s by edit distance, when it is close
// enough to be a typo (at most a third of its length, and at most 3), or
// when s is a prefix of exactly one candidate.
func nearest(s string, candidates []string) string {
	best, bestDist := "", 4
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(s), c); d < bestDist && d <= max(1, len(c)/3) {
			best, bestDist = c, d
		}
	}
	if best == "" && len(s) >= 3 {
		var prefixed []string
		for _, c := range candidates {
			if strings.HasPrefix(c, strings.ToLower(s)) {
				prefixed = append(prefixed, c)
			}
		}
		if len(prefixed) == 1 {
			best = prefixed[0]
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment): a swapped pair of letters is one edit.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = slices.Min([]int{d[i-1][j] + 1, d[i][j-1] + 1, d[i-1][j-1] + cost})
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
