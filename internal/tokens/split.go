package tokens

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers below reproduce, without a regex engine, the split
// patterns of tiktoken-go v0.1.8 (encoding.go) as github.com/dlclark/regexp2
// runs them: a backtracking engine whose alternation is ordered (the first
// alternative that matches at a position wins, not the longest), which
// reads the text as runes, takes \s as unicode.IsSpace and \p{..} from the
// unicode package's tables, and under (?i) compares unicode.ToLower of
// the text's rune. Both read the same unicode tables, those of the Go
// release the binary is built with. Each next* function returns the end
// of the piece that starts at byte i of a valid UTF-8 text (i < len(s));
// every rune belongs to some alternative, so pieces tile the text.
// count_test.go compares the pieces with regexp2's on the same patterns.

// Character classes, as bits.
const (
	cL  = 1 << iota // \p{L}
	cN              // \p{N}
	cS              // \s (unicode.IsSpace)
	cU              // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (o200k_base)
	cW              // [\p{Ll}\p{Lm}\p{Lo}\p{M}] (o200k_base)
	cNL             // \r or \n
)

// asciiClass holds the classes of ASCII runes (built at init: 128 runes;
// 256 entries, so indexing by a byte needs no bounds check).
var asciiClass = func() (t [256]uint8) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = computeClass(r)
	}
	return t
}()

// runeClasses holds the classes of every rune as a two-level table: the
// index, by r>>8, names a 256-byte block of blocks; identical blocks are
// stored once (134 blocks, 34 KB, in all). It is built once, before the
// first encoder is returned.
var runeClasses struct {
	once   sync.Once
	index  [(unicode.MaxRune + 1) >> 8]uint16
	blocks []uint8
}

func buildClasses() {
	runeClasses.once.Do(func() {
		flat := make([]uint8, unicode.MaxRune+1)
		set := func(t *unicode.RangeTable, bit uint8) {
			for _, r := range t.R16 {
				for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
					flat[c] |= bit
				}
			}
			for _, r := range t.R32 {
				for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
					flat[c] |= bit
				}
			}
		}
		set(unicode.L, cL)
		set(unicode.N, cN)
		for _, t := range []*unicode.RangeTable{unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M} {
			set(t, cU)
		}
		for _, t := range []*unicode.RangeTable{unicode.Ll, unicode.Lm, unicode.Lo, unicode.M} {
			set(t, cW)
		}
		// unicode.IsSpace: its own list in Latin-1, White_Space above.
		for r := range rune(0x100) {
			if unicode.IsSpace(r) {
				flat[r] |= cS
			}
		}
		for _, r := range unicode.White_Space.R16 {
			for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
				if c >= 0x100 {
					flat[c] |= cS
				}
			}
		}
		for _, r := range unicode.White_Space.R32 {
			for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
				if c >= 0x100 {
					flat[c] |= cS
				}
			}
		}
		flat['\r'] |= cNL
		flat['\n'] |= cNL
		seen := make(map[[256]uint8]uint16)
		var blocks []uint8
		for b := range runeClasses.index {
			var block [256]uint8
			copy(block[:], flat[b<<8:])
			n, ok := seen[block]
			if !ok {
				n = uint16(len(seen))
				seen[block] = n
				blocks = append(blocks, block[:]...)
			}
			runeClasses.index[b] = n
		}
		runeClasses.blocks = blocks
	})
}

// computeClass is the class of r from the unicode package, rune by rune:
// the reference the tables are built from and tested against.
func computeClass(r rune) uint8 {
	var c uint8
	if unicode.Is(unicode.L, r) {
		c |= cL
	}
	if unicode.Is(unicode.N, r) {
		c |= cN
	}
	if unicode.IsSpace(r) {
		c |= cS
	}
	if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cU
	}
	if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cW
	}
	if r == '\r' || r == '\n' {
		c |= cNL
	}
	return c
}

// classOf is the class of a rune (buildClasses must have run).
func classOf(r rune) uint8 {
	if uint32(r) > unicode.MaxRune {
		return 0
	}
	return runeClasses.blocks[int(runeClasses.index[r>>8])<<8|int(r&0xff)]
}

// at returns the class and the size of the rune at byte i of s.
func at(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	return atMulti(s, i)
}

// atMulti is at for a rune of more than one byte (kept out of at, so at
// inlines).
func atMulti(s string, i int) (uint8, int) {
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOf(r), n
}

// runOf returns the end of the run of runes with any of the class bits,
// from byte i.
func runOf(s string, i int, bits uint8) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiClass[b]&bits == 0 {
				break
			}
			i++
			continue
		}
		c, n := atMulti(s, i)
		if c&bits == 0 {
			break
		}
		i += n
	}
	return i
}

// runNotOf returns the end of the run of runes with none of the class
// bits, from byte i.
func runNotOf(s string, i int, bits uint8) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiClass[b]&bits != 0 {
				break
			}
			i++
			continue
		}
		c, n := atMulti(s, i)
		if c&bits != 0 {
			break
		}
		i += n
	}
	return i
}

// lowerAt returns unicode.ToLower of the rune at byte i and its size, or
// (-1, 0) past the end: what regexp2 compares under (?i). (No rune
// outside ASCII lowers to a letter of the contractions today; only
// U+0130 and U+212A lower into ASCII at all.)
func lowerAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		return rune(c), 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return unicode.ToLower(r), n
}

// contraction returns the length in bytes of
// (?i:'s|'t|'re|'ve|'m|'ll|'d) at byte i (0: no match). Case-sensitive
// (p50k_base, r50k_base) compares the runes themselves.
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	get := func(j int) (rune, int) {
		if !fold {
			if j >= len(s) {
				return -1, 0
			}
			r, n := utf8.DecodeRuneInString(s[j:])
			return r, n
		}
		return lowerAt(s, j)
	}
	r1, n1 := get(i + 1)
	switch r1 {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v', 'l':
		want := 'e'
		if r1 == 'l' {
			want = 'l'
		}
		if r2, n2 := get(i + 1 + n1); r2 == want {
			return 1 + n1 + n2
		}
	}
	return 0
}

// whitespace matches the whitespace alternatives shared by the
// encodings at byte i, where a \s rune starts: `\s*[\r\n]+` (withNL:
// cl100k_base, o200k_base), then `\s+(?!\S)`, then `\s+`.
func whitespace(s string, i int, withNL bool) int {
	j, last, lastNL := i, i, -1
	for j < len(s) {
		c, n := at(s, j)
		if c&cS == 0 {
			break
		}
		if c&cNL != 0 {
			lastNL = j
		}
		last = j
		j += n
	}
	// \s*[\r\n]+: the greedy \s* backs off to the last newline of the
	// run, and [\r\n]+ takes it (the rune after it is not a newline).
	if withNL && lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S): the whole run at the end of the text, else all but its
	// last rune (which is followed by a non-space); a single rune before
	// a non-space falls to \s+.
	if j == len(s) || last == i {
		return j
	}
	return last
}

// nextCL100K splits by cl100k_base's pattern:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func nextCL100K(s string, i int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	c, n := at(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&cL != 0 {
		return runOf(s, i+n, cL)
	}
	if c&(cNL|cL|cN) == 0 && i+n < len(s) {
		if c2, n2 := at(s, i+n); c2&cL != 0 {
			return runOf(s, i+n+n2, cL)
		}
	}
	// \p{N}{1,3}
	if c&cN != 0 {
		return digits3(s, i+n)
	}
	// ?[^\s\p{L}\p{N}]+[\r\n]*
	if j := punct(s, i, c, n); j > 0 {
		return runNewlines(s, j, false)
	}
	return whitespace(s, i, true)
}

// digits3 ends \p{N}{1,3} whose first rune ends at byte i.
func digits3(s string, i int) int {
	for k := 0; k < 2 && i < len(s); k++ {
		c, n := at(s, i)
		if c&cN == 0 {
			break
		}
		i += n
	}
	return i
}

// punct matches ` ?[^\s\p{L}\p{N}]+` at byte i, whose rune has class c and
// size n; it returns the end, or 0.
func punct(s string, i int, c uint8, n int) int {
	if s[i] == ' ' && i+1 < len(s) {
		if c2, n2 := at(s, i+1); c2&(cS|cL|cN) == 0 {
			return runNotOf(s, i+1+n2, cS|cL|cN)
		}
	}
	if c&(cS|cL|cN) == 0 {
		return runNotOf(s, i+n, cS|cL|cN)
	}
	return 0
}

// runNewlines ends [\r\n]* (slash: [\r\n/]*) from byte i.
func runNewlines(s string, i int, slash bool) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n' || slash && s[i] == '/') {
		i++
	}
	return i
}

// nextO200K splits by o200k_base's pattern, the alternatives
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//	\p{N}{1,3}
//	 ?[^\s\p{L}\p{N}]+[\r\n/]*
//	\s*[\r\n]+
//	\s+(?!\S)
//	\s+
//
// in this order; each optional prefix is tried present, then absent.
func nextO200K(s string, i int) int {
	c, n := at(s, i)
	prefix := c&(cNL|cL|cN) == 0 && i+n < len(s)
	if prefix {
		if j := o200kLower(s, i+n); j > 0 {
			return j
		}
	}
	if c&(cU|cW) != 0 {
		if j := o200kLower(s, i); j > 0 {
			return j
		}
	}
	if prefix {
		if j := o200kUpper(s, i+n); j > 0 {
			return j
		}
	}
	if c&cU != 0 {
		return o200kUpper(s, i)
	}
	if c&cN != 0 {
		return digits3(s, i+n)
	}
	if j := punct(s, i, c, n); j > 0 {
		return runNewlines(s, j, true)
	}
	return whitespace(s, i, true)
}

// o200kLower matches U*W+(?i:contraction)? from byte i (U and W the
// class sets above), returning the end or 0. The greedy U* takes the
// whole U run; when no W rune follows it, it backs off rune by rune to
// the last rune of the run that is also W (Lm, Lo, M), which W+ then
// takes alone.
func o200kLower(s string, i int) int {
	j, lastW := i, 0
	for j < len(s) {
		c, n := asciiClass[s[j]], 1
		if s[j] >= utf8.RuneSelf {
			c, n = atMulti(s, j)
		}
		if c&cU == 0 {
			if c&cW != 0 {
				return o200kContraction(s, runOf(s, j+n, cW))
			}
			break
		}
		j += n
		if c&cW != 0 {
			lastW = j
		}
	}
	if lastW == 0 {
		return 0
	}
	return o200kContraction(s, lastW)
}

// o200kUpper matches U+W*(?i:contraction)? from byte i, or returns 0.
func o200kUpper(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	if c, _ := at(s, i); c&cU == 0 {
		return 0
	}
	return o200kContraction(s, runOf(s, runOf(s, i, cU), cW))
}

func o200kContraction(s string, i int) int {
	return i + contraction(s, i, true)
}

// nextP50K splits by the pattern of p50k_base and r50k_base:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func nextP50K(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	if s[i] == ' ' && i+1 < len(s) {
		c2, n2 := at(s, i+1)
		switch {
		case c2&cL != 0:
			return runOf(s, i+1+n2, cL)
		case c2&cN != 0:
			return runOf(s, i+1+n2, cN)
		case c2&cS == 0:
			return runNotOf(s, i+1+n2, cS|cL|cN)
		}
	}
	c, n := at(s, i)
	switch {
	case c&cL != 0:
		return runOf(s, i+n, cL)
	case c&cN != 0:
		return runOf(s, i+n, cN)
	case c&cS == 0:
		return runNotOf(s, i+n, cS|cL|cN)
	}
	return whitespace(s, i, false)
}
