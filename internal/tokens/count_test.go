package tokens

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// The counter is held to tiktoken-go's EncodeOrdinary, the oracle: the
// same count on every text, and (a stronger check of the split) the same
// token ids from the counter's split followed by a plain tiktoken merge.

var allEncodings = []string{CL100K, O200K, P50K, R50K}

var oracles struct {
	once sync.Once
	mu   sync.Mutex
	enc  map[string]*tiktoken.Tiktoken
}

// oracle returns tiktoken-go's encoder (from the offline BPE files: the
// default loader would download them).
func oracle(t testing.TB, name string) *tiktoken.Tiktoken {
	t.Helper()
	oracles.once.Do(func() {
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		oracles.enc = make(map[string]*tiktoken.Tiktoken)
	})
	oracles.mu.Lock()
	defer oracles.mu.Unlock()
	if e, ok := oracles.enc[name]; ok {
		return e
	}
	e, err := tiktoken.GetEncoding(name)
	if err != nil {
		t.Fatal(err)
	}
	oracles.enc[name] = e
	return e
}

func counterOf(t testing.TB, name string) *bpe {
	t.Helper()
	return mustEncoding(t, name).(*bpe)
}

// pieces splits text as the counter does.
func (b *bpe) pieces(text string) []string {
	if !utf8.ValidString(text) {
		text = replaceInvalid(text)
	}
	var out []string
	for i := 0; i < len(text); {
		j := b.next(text, i)
		if j <= i || j > len(text) {
			panic(fmt.Sprintf("split of %q stuck at %d (next %d)", text, i, j))
		}
		out = append(out, text[i:j])
		i = j
	}
	return out
}

// ids encodes text with the counter's split and tiktoken-go's merge:
// what EncodeOrdinary returns when the split is the same.
func (b *bpe) ids(text string) []int {
	var out []int
	for _, p := range b.pieces(text) {
		if r := b.ranks.rank(p); r != noRank {
			out = append(out, int(r))
			continue
		}
		out = append(out, b.refMerge(p)...)
	}
	return out
}

// refMerge is tiktoken-go's bytePairMerge (bpe.go), ported as written:
// the ids of a piece that is not one token.
func (b *bpe) refMerge(p string) []int {
	type part struct{ start, rank int }
	parts := make([]part, len(p)+1)
	get := func(i, skip int) int {
		if i+skip+2 < len(parts) {
			if r := b.ranks.rank(p[parts[i].start:parts[i+skip+2].start]); r != noRank {
				return int(r)
			}
		}
		return -1
	}
	for i := range parts {
		parts[i] = part{i, noRank}
	}
	for i := 0; i < len(parts)-2; i++ {
		if r := get(i, 0); r >= 0 {
			parts[i].rank = r
		}
	}
	for len(parts) > 1 {
		minRank, k := noRank, -1
		for i := 0; i < len(parts)-1; i++ {
			if parts[i].rank < minRank {
				minRank, k = parts[i].rank, i
			}
		}
		if k < 0 {
			break
		}
		parts[k].rank = noRank
		if r := get(k, 1); r >= 0 {
			parts[k].rank = r
		}
		if k > 0 {
			parts[k-1].rank = noRank
			if r := get(k-1, 1); r >= 0 {
				parts[k-1].rank = r
			}
		}
		parts = append(parts[:k+1], parts[k+2:]...)
	}
	var out []int
	for i := 0; i+1 < len(parts); i++ {
		out = append(out, int(b.ranks.rank(p[parts[i].start:parts[i+1].start])))
	}
	return out
}

// patterns are tiktoken-go v0.1.8's split patterns (encoding.go),
// verbatim, for the piece-by-piece check.
var patterns = map[string]string{
	O200K: strings.Join([]string{
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`\p{N}{1,3}`,
		` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
		`\s*[\r\n]+`,
		`\s+(?!\S)`,
		`\s+`,
	}, "|"),
	CL100K: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	P50K:   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
	R50K:   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
}

var compiled sync.Map // encoding -> *regexp2.Regexp

// regexPieces splits text as tiktoken-go does: regexp2 over its runes.
func regexPieces(name, text string) []string {
	v, ok := compiled.Load(name)
	if !ok {
		v, _ = compiled.LoadOrStore(name, regexp2.MustCompile(patterns[name], regexp2.None))
	}
	re := v.(*regexp2.Regexp)
	var out []string
	m, _ := re.FindStringMatch(text)
	for m != nil {
		out = append(out, m.String())
		m, _ = re.FindNextMatch(m)
	}
	return out
}

// check compares the counter with the oracle on text: the count with
// tiktoken-go's, the ids of the counter's split with tiktoken-go's, and
// the pieces with the regex's (for texts up to 4 KB: on longer ones a
// different split would show in the ids, and the regex costs seconds
// under the race detector).
func check(t testing.TB, name, text string) {
	t.Helper()
	b := counterOf(t, name)
	want := oracle(t, name).EncodeOrdinary(text)
	got := b.Count(text)
	if len(text) > 4<<10 {
		if got != len(want) {
			t.Errorf("%s: Count(%q) = %d, tiktoken-go %d", name, clip(text), got, len(want))
		} else if ids := b.ids(text); !slices.Equal(ids, want) {
			t.Errorf("%s: the ids of %q differ from tiktoken-go's", name, clip(text))
		}
		return
	}
	if pieces, wantPieces := b.pieces(text), regexPieces(name, text); !slices.Equal(pieces, wantPieces) {
		t.Errorf("%s: the split of %q differs from the regex's (count %d, tiktoken-go %d)\npieces %q\nregex  %q", name, clip(text), got, len(want), clipPieces(pieces), clipPieces(wantPieces))
		return
	}
	if got != len(want) {
		t.Errorf("%s: Count(%q) = %d, tiktoken-go %d", name, clip(text), got, len(want))
		return
	}
	if ids := b.ids(text); !slices.Equal(ids, want) {
		t.Errorf("%s: the ids of %q differ from tiktoken-go's", name, clip(text))
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func clipPieces(p []string) []string {
	if len(p) > 60 {
		return p[:60]
	}
	return p
}

// tricky holds the texts the splitters must get right, one feature each.
var tricky = []string{
	// Prose, code, JSON.
	sampleEnglish, sampleCode, sampleJSON, sampleChinese,
	"Hello, world! How's it going? I'm fine; you're late -- we'll see.",
	// CJK, Arabic, Hindi, Thai, Korean, combining marks.
	"日本語のテキスト、カタカナ「ヘルプ」ーとひらがな。漢字123。",
	"한국어 텍스트입니다. 안녕하세요!",
	"مرحبا بالعالم، كيف حالك اليوم؟ ١٢٣٤ ٥٦",
	"नमस्ते दुनिया, आप कैसे हैं? क्षत्रिय ज्ञान",
	"ภาษาไทยไม่มีช่องว่างระหว่างคำ",
	"e\u0301te\u0301 cafe\u0301 A\u0301BC \u0301\u0301A \u0301abc x\u0301\u0302Y Ä\u0301B'S",
	"\u0301", "\u0301A", " \u0301A", "\u0301'S", "\u0301\u0301", "a\u0301'LL",
	// Case classes of o200k_base: Lu, Ll, Lt, Lm, Lo, M.
	"HelloWorld ABCdef ABC DEF aBC ǅungla ǅǅa ǈ ʰʰa ʰA Aʰ Aʰb 中A A中 ÀBC'S camelCaseIdentifier HTTPServer getURLFor",
	"XMLHttpRequest IOError iOS macOS JSONSchema ASCII'S NASA'll",
	// Emoji and ZWJ sequences.
	"👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 thumbs 🙂🙂🙂 ok✅done ❤️",
	"\u200d\u200dx \u200da\u200db",
	// Digits.
	"1 12 123 1234 1234567 12345678901 3.14159 1,000,000 0x1F -42 +7",
	"٣٤٥ ½ Ⅻ ①②③ ²³ 1٢3 １２３４",
	"v1.2.3 2024-01-02T03:04:05Z a1b2c3 abc123def 123abc",
	// Contractions, any case.
	"I'LL don't 'S 'Re we've THEY'RE it's O'Neil 'll 'LL 'lL 'd 'D 'm 'M 'T 've 'VE 're 'rE",
	"'", "''", "'s", "'S's", "x's'S", "'l", "'lx", "'r", "'v", "'ve'", "don''t", " 's", "\n's", "'Ş", "'ſ", "'ı", "'K", "'K",
	"ĸ's ǅ'S 中'S ʰ'Ll",
	// Whitespace runs.
	"a  b\t\tc\r\n\r\nd   \n  e \n\n\tf  ", "   ", "\n", " \n ", "\r\n", "\n\n\n", " \t \n \t x",
	"trailing   ", "trailing  \n", "  .,;", " !", "  !", "\t!", "a \u00a0b", "\u00a0\u00a0x", "\u3000漢字",
	"a\u2028b\u2029c", "x\u0085y \u0085 z", "\v\f x", "end \n", "end\n ", " \n\n x", "a\r\rb", "a \r b",
	"\t\tfunc x() {\n\t\treturn\n\t}\n", "    indented\n        more\n",
	// Punctuation and slashes.
	"path/to//file\n//comment\r\n/x", "}\n/\n/", "<<>> ... !!! ??? ===== ----- ***", "a.b,c;d:e!f?g", " /usr/bin", "\"quoted\"",
	"<|endoftext|> <|fim_prefix|> <|endofprompt|>",
	// Invalid UTF-8 (counted as tiktoken-go counts it: each bad byte is U+FFFD).
	"\xff\xfeabc", "a\xc3", "\xed\xa0\x80", "hello\x80world", "\xef\xbf\xbd real replacement", "\xc3\x28", "ab\xf0\x9f\x98",
	" \xffx", "\xff\xff\xff", "'\xff", "1\xff2",
	// Long pieces (the heap merge).
	strings.Repeat("a", 1000), strings.Repeat("ab", 300), strings.Repeat("=", 200), strings.Repeat(" ", 500) + "x",
	strings.Repeat("\n", 300), strings.Repeat("9", 100), strings.Repeat("中文", 200), strings.Repeat("ʰ", 100),
	"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg",
	"Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism supercalifragilisticexpialidocious",
	strings.Repeat("abcdefghijklmnopqrstuvwxyz", 10) + strings.Repeat("ZYXWVUTSRQPONMLKJIHGFEDCBA", 10),
}

// trickyRunes is the alphabet of the random texts.
var trickyRunes = []string{
	"a", "b", "Z", "s", "S", "l", "L", "t", "e", "'", " ", " ", "\t", "\r", "\n", "1", "2", "٣", "中", "文", "ʰ", "ǅ",
	"\u0301", "/", ".", "!", "\u00a0", "\u3000", "😀", "\u200d", "é", "ß", "İ", "K", "ſ", "\u0085", "_", "-", "\xff",
	"Ä", "ー", "ก", "\u0E31", "½", "\u2028", "\v", "{", "\"",
}

func randomText(r *rand.Rand, n int) string {
	var sb strings.Builder
	for range n {
		sb.WriteString(trickyRunes[r.IntN(len(trickyRunes))])
	}
	return sb.String()
}

func TestCountMatchesTiktoken(t *testing.T) {
	files := corpusFiles(t)
	for _, name := range allEncodings {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, text := range tricky {
				check(t, name, text)
			}
			for _, f := range files {
				check(t, name, f)
			}
			r := rand.New(rand.NewPCG(1, uint64(len(name))))
			for range 1500 {
				check(t, name, randomText(r, 1+r.IntN(40)))
			}
		})
	}
}

// corpusFiles reads the repository's docs and this package's sources:
// real prose, Markdown, tables and Go.
func corpusFiles(t *testing.T) []string {
	t.Helper()
	var paths []string
	for _, pattern := range []string{"../../docs/*.md", "*.go", "../../README.md", "../middleware/chain.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, m...)
	}
	if len(paths) < 5 {
		t.Fatalf("corpus: only %d files", len(paths))
	}
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	out = append(out, benchJSON(20<<10))
	return out
}

func FuzzCountMatchesTiktoken(f *testing.F) {
	for _, s := range tricky {
		if len(s) <= 200 {
			f.Add(s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range allEncodings {
			check(t, name, s)
		}
	})
}

// Both merges (the quadratic scan of short pieces, the heap of long
// ones) count what tiktoken-go's merge gives, on every piece that is not
// one token: the heap merge on short pieces too, where ties (a pair
// repeated, "aaaa") are frequent.
func TestMergesMatchTiktoken(t *testing.T) {
	texts := append(corpusFiles(t), tricky...)
	texts = append(texts, "aaaa", "aaaaaaa", "abababab", "     ", "\t\t\t\t\t", "........", "0000000", "==========")
	for _, name := range []string{CL100K, O200K} {
		b := counterOf(t, name)
		small, large := 0, 0
		for _, text := range texts {
			for _, p := range b.pieces(text) {
				if len(p) < 2 || b.ranks.has(p) {
					continue
				}
				want := len(b.refMerge(p))
				if len(p) <= smallPiece {
					small++
					if got := b.mergeSmall(p); got != want {
						t.Errorf("%s: mergeSmall(%q) = %d, tiktoken-go %d", name, p, got, want)
					}
				} else {
					large++
				}
				if got := b.mergeLarge(p); got != want {
					t.Errorf("%s: mergeLarge(%q) = %d, tiktoken-go %d", name, clip(p), got, want)
				}
			}
		}
		if small < 50 || large < 20 {
			t.Errorf("%s: only %d short and %d long pieces merged", name, small, large)
		}
	}
}

// The rune class tables are the unicode package's classes, rune by rune.
func TestClassTables(t *testing.T) {
	buildClasses()
	step := rune(1)
	if testing.Short() {
		step = 7
	}
	for r := rune(0); r <= unicode.MaxRune; r += step {
		if got, want := classOf(r), computeClass(r); got != want {
			t.Fatalf("class of %U = %06b, want %06b", r, got, want)
		}
	}
	for r := range rune(utf8.RuneSelf) {
		if asciiClass[r] != classOf(r) {
			t.Fatalf("ASCII class of %U differs", r)
		}
	}
	if classOf(-1) != 0 || classOf(unicode.MaxRune+1) != 0 {
		t.Error("a rune out of range has a class")
	}
}

// Count is safe for concurrent use (run with -race).
func TestCountConcurrent(t *testing.T) {
	for _, name := range []string{CL100K, O200K} {
		b := counterOf(t, name)
		texts := []string{sampleEnglish, sampleChinese, strings.Repeat("ab", 300), sampleJSON}
		want := make([]int, len(texts))
		for i, s := range texts {
			want[i] = b.Count(s)
		}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for k := range 50 {
					i := (g + k) % len(texts)
					if got := b.Count(texts[i]); got != want[i] {
						t.Errorf("%s: concurrent count %d, want %d", name, got, want[i])
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

// Counting valid text allocates nothing (long pieces take their scratch
// from a pool, which a collection may empty: they are left out).
func TestCountAllocatesNothing(t *testing.T) {
	for _, name := range []string{CL100K, O200K} {
		b := counterOf(t, name)
		text := sampleEnglish + sampleCode + sampleJSON + "你好，世界"
		if n := testing.AllocsPerRun(20, func() { b.Count(text) }); n != 0 {
			t.Errorf("%s: %v allocations per count", name, n)
		}
	}
}

// Benchmark texts: a chat message (60 bytes), English prose (4 KB), JSON
// (100 KB: a tool result), Chinese (20 KB).
var benchTexts = sync.OnceValue(func() []struct{ name, text string } {
	chat := "Can you check the weather in Paris tomorrow, please? Thanks!"
	english := repeatTo(sampleEnglish+" It's what we'd expect: 12 runs, 345 tokens.\n\n", 4<<10)
	chinese := repeatTo(sampleChinese, 20<<10)
	return []struct{ name, text string }{
		{"chat60", chat}, {"english4K", english}, {"json100K", benchJSON(100 << 10)}, {"chinese20K", chinese},
	}
})

// repeatTo repeats s to about n bytes, cut at a rune boundary.
func repeatTo(s string, n int) string {
	r := strings.Repeat(s, n/len(s)+1)[:n]
	for !utf8.ValidString(r) {
		r = r[:len(r)-1]
	}
	return r
}

// benchJSON is about n bytes of a search tool's JSON result.
func benchJSON(n int) string {
	type hit struct {
		ID      int      `json:"id"`
		Title   string   `json:"title"`
		URL     string   `json:"url"`
		Snippet string   `json:"snippet"`
		Score   float64  `json:"score"`
		Tags    []string `json:"tags"`
		Fresh   bool     `json:"fresh"`
	}
	r := rand.New(rand.NewPCG(7, 7))
	words := strings.Fields(sampleEnglish)
	var hits []hit
	size := 0
	for i := 0; size < n; i++ {
		snippet := strings.Join(words[r.IntN(20):20+r.IntN(len(words)-20)], " ")
		h := hit{ID: 1000 + i, Title: fmt.Sprintf("Result %d: %s %s", i, words[r.IntN(len(words))], words[r.IntN(len(words))]),
			URL:     fmt.Sprintf("https://example.com/docs/%d/%s?ref=search&page=%d", r.IntN(100000), words[r.IntN(len(words))], i),
			Snippet: snippet, Score: float64(r.IntN(100000)) / 1000, Tags: []string{"docs", words[r.IntN(len(words))]}, Fresh: i%3 == 0}
		b, _ := json.Marshal(h)
		size += len(b) + 1
		hits = append(hits, h)
	}
	b, _ := json.Marshal(map[string]any{"query": "agent runs on JetStream", "results": hits})
	return string(b)
}

func BenchmarkCount(b *testing.B) {
	for _, name := range []string{CL100K, O200K} {
		counter := counterOf(b, name)
		old := oracle(b, name)
		for _, tc := range benchTexts() {
			if got, want := counter.Count(tc.text), len(old.EncodeOrdinary(tc.text)); got != want {
				b.Fatalf("%s/%s: count %d, tiktoken-go %d", name, tc.name, got, want)
			}
			b.Run(name+"/"+tc.name+"/old", func(b *testing.B) {
				b.SetBytes(int64(len(tc.text)))
				b.ReportAllocs()
				for b.Loop() {
					_ = len(old.EncodeOrdinary(tc.text))
				}
			})
			b.Run(name+"/"+tc.name+"/new", func(b *testing.B) {
				b.SetBytes(int64(len(tc.text)))
				b.ReportAllocs()
				for b.Loop() {
					_ = counter.Count(tc.text)
				}
			})
		}
	}
}

// The rank table holds every token of the BPE file with its rank, and
// nothing else.
func TestRankTable(t *testing.T) {
	for _, name := range []string{CL100K, O200K, P50K} {
		ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		table := counterOf(t, name).ranks
		misses := 0
		for tok, r := range ranks {
			if got := table.rank(tok); got != int32(r) {
				t.Fatalf("%s: rank(%q) = %d, want %d", name, tok, got, r)
			}
			// The token with a byte more or less, when that is no token.
			for _, other := range []string{tok + "\x00", tok[:len(tok)-1], "\xff" + tok} {
				if _, ok := ranks[other]; !ok && other != "" {
					misses++
					if got := table.rank(other); got != noRank {
						t.Fatalf("%s: rank(%q) = %d, want none", name, other, got)
					}
				}
			}
		}
		if misses < len(ranks) {
			t.Errorf("%s: only %d non-tokens looked up", name, misses)
		}
		if table.rank("") != noRank || table.rank(strings.Repeat("a", 300)) != noRank {
			t.Errorf("%s: the empty or a long string has a rank", name)
		}
	}
}

// Tokens that share their first 8 bytes, zero-padded, are told apart, in
// a table so full that every probe sequence crosses others.
func TestRankTableLookalikes(t *testing.T) {
	toks := []string{"a", "a\x00", "a\x00\x00", "\x00", "\x00\x00\x00", "abcdefgh", "abcdefghi", "abcdefghj", "abcdefghij", "ab", "b"}
	for i := range 20 {
		toks = append(toks, fmt.Sprintf("t%03d", i))
	}
	ranks := make(map[string]int)
	for i, tok := range toks {
		ranks[tok] = i
	}
	for range 20 { // fresh seeds, fresh collisions
		table, err := newRankTableSlots(ranks, 32)
		if err != nil {
			t.Fatal(err)
		}
		for tok, r := range ranks {
			if got := table.rank(tok); got != int32(r) {
				t.Fatalf("rank(%q) = %d, want %d", tok, got, r)
			}
		}
		for _, s := range []string{"a\x00\x00\x00", "abcdefg", "abcdefghk", "abcdefgh\x00", "t030", "ba", "\x00\x00"} {
			if got := table.rank(s); got != noRank {
				t.Fatalf("rank(%q) = %d, want none", s, got)
			}
		}
	}
	if _, err := newRankTable(map[string]int{"a": 0, "b": 0}); err == nil {
		t.Error("a rank given twice was accepted")
	}
	if _, err := newRankTableSlots(ranks, len(ranks)); err == nil {
		t.Error("a table without an empty slot was built")
	}
}
