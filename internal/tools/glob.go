package tools

import (
	"fmt"
	"path"
	"strings"
)

// globPattern is a compiled glob: one or more brace alternatives, each a
// list of path segments where "**" matches any number of directories and
// every other segment follows path.Match (*, ?, [a-z]).
type globPattern struct {
	alts [][]string
}

// maxBraceAlternatives bounds what "{a,b}{c,d}..." may expand to.
const maxBraceAlternatives = 64

// compileGlob checks and compiles a slash-separated, relative pattern.
func compileGlob(pattern string) (*globPattern, error) {
	if pattern == "" {
		return nil, fmt.Errorf("the pattern is empty; use something like **/*.md")
	}
	alts, err := expandBraces(pattern)
	if err != nil {
		return nil, err
	}
	g := &globPattern{}
	for _, a := range alts {
		var segs []string
		for _, s := range strings.Split(a, "/") {
			if s == "" || s == "." {
				continue
			}
			if s != "**" {
				if _, err := path.Match(s, ""); err != nil {
					return nil, fmt.Errorf("the pattern %q is malformed near %q (check its [ ] brackets)", pattern, s)
				}
			}
			segs = append(segs, s)
		}
		g.alts = append(g.alts, segs)
	}
	return g, nil
}

// match reports whether the relative, slash-separated name matches.
func (g *globPattern) match(name string) bool {
	parts := strings.Split(strings.Trim(name, "/"), "/")
	for _, segs := range g.alts {
		if matchSegments(segs, parts) {
			return true
		}
	}
	return false
}

func matchSegments(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			// Collapse repeated ** and try every split point.
			for len(pat) > 1 && pat[1] == "**" {
				pat = pat[1:]
			}
			if len(pat) == 1 {
				return true
			}
			for i := 0; i <= len(name); i++ {
				if matchSegments(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// expandBraces turns "*.{go,md}" into "*.go" and "*.md", recursively.
func expandBraces(p string) ([]string, error) {
	open := strings.IndexByte(p, '{')
	if open < 0 {
		return []string{p}, nil
	}
	depth, end := 0, -1
	var commas []int
	for i := open; i < len(p) && end < 0; i++ {
		switch p[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				end = i
			}
		case ',':
			if depth == 1 {
				commas = append(commas, i)
			}
		}
	}
	if end < 0 {
		return nil, fmt.Errorf("the pattern %q has a { without its }", p)
	}
	var out []string
	start := open + 1
	for _, c := range append(commas, end) {
		rest, err := expandBraces(p[:open] + p[start:c] + p[end+1:])
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
		if len(out) > maxBraceAlternatives {
			return nil, fmt.Errorf("the pattern %q expands to more than %d alternatives", p, maxBraceAlternatives)
		}
		start = c + 1
	}
	return out, nil
}
