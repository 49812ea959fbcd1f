package tokens

import (
	"fmt"
	"math"
	"sync"
	"unicode/utf8"

	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// bpe counts the tokens of a tiktoken encoding: the text is split by the
// encoding's pattern (split.go), a piece found whole in the ranks is one
// token, any other is merged byte pair by byte pair, lowest rank first,
// as tiktoken does. Only the count is kept: no token ids, and no
// allocation (pieces of up to smallPiece bytes merge on the stack, longer
// ones in scratch memory from a sync.Pool; only a text that is not valid
// UTF-8 is copied). Special tokens in the text are counted as ordinary
// text, as a provider counts user content. Counts equal tiktoken-go's
// len(EncodeOrdinary(text)) (count_test.go holds it to that on a corpus
// and by fuzzing). A bpe is safe for concurrent use: it is read-only
// after newBPE.
type bpe struct {
	name  string
	next  func(s string, i int) int
	ranks *rankTable
}

// newBPE loads an encoding's ranks from the BPE files compiled into the
// binary (tiktoken-go-loader; nothing is downloaded).
func newBPE(name string) (*bpe, error) {
	b := &bpe{name: name}
	switch name {
	case CL100K:
		b.next = nextCL100K
	case O200K:
		b.next = nextO200K
	case P50K, R50K:
		b.next = nextP50K
	default:
		return nil, fmt.Errorf("unknown encoding %q", name)
	}
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
	if err != nil {
		return nil, err
	}
	// The loader's map is dropped once the table is built.
	if b.ranks, err = newRankTable(ranks); err != nil {
		return nil, err
	}
	buildClasses()
	return b, nil
}

func (b *bpe) Encoding() string { return b.name }

func (b *bpe) Count(text string) int {
	if text == "" {
		return 0
	}
	if !utf8.ValidString(text) {
		text = replaceInvalid(text)
	}
	n := 0
	// A direct call per encoding (cheaper than through b.next).
	switch b.name {
	case CL100K:
		for i := 0; i < len(text); {
			j := nextCL100K(text, i)
			n += b.piece(text[i:j])
			i = j
		}
	case O200K:
		for i := 0; i < len(text); {
			j := nextO200K(text, i)
			n += b.piece(text[i:j])
			i = j
		}
	default:
		for i := 0; i < len(text); {
			j := b.next(text, i)
			n += b.piece(text[i:j])
			i = j
		}
	}
	return n
}

// replaceInvalid replaces every byte of text that is not part of valid
// UTF-8 by U+FFFD. That is what tiktoken-go counts: regexp2 matches
// []rune(text), in which each such byte is one utf8.RuneError, and the
// pieces are cut from those runes and turned back into strings (three
// bytes per U+FFFD). The count of an invalid text is then exactly
// tiktoken-go's, not an estimate.
func replaceInvalid(text string) string {
	out := make([]byte, 0, len(text)+16)
	for _, r := range text {
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}

// piece counts the tokens of one piece of the split.
func (b *bpe) piece(p string) int {
	if len(p) == 1 {
		return 1
	}
	if b.ranks.has(p) {
		return 1
	}
	if len(p) <= smallPiece {
		return b.mergeSmall(p)
	}
	return b.mergeLarge(p)
}

// smallPiece bounds the pieces merged on the stack by the quadratic scan
// (most pieces: words, numbers, punctuation); longer ones (runs of CJK,
// long words, identifiers, base64) go through a heap, twice as fast from
// about 16 bytes on.
const smallPiece = 16

const noRank = math.MaxInt32

// rank returns the rank of p, or noRank.
func (b *bpe) rank(p string) int32 { return b.ranks.rank(p) }

// mergeSmall is tiktoken-go's bytePairMerge counting only: parts are the
// byte offsets where tokens start, rank[k] the rank of the merge of part
// k with part k+1; the lowest rank merges first, the leftmost on ties.
func (b *bpe) mergeSmall(p string) int {
	var startBuf [smallPiece + 1]int32
	var rankBuf [smallPiece + 1]int32
	m := len(p) + 1
	start, rank := startBuf[:m], rankBuf[:m]
	for k := range m {
		start[k] = int32(k)
		rank[k] = noRank
	}
	for k := 0; k+2 < m; k++ {
		rank[k] = b.rank(p[k : k+2])
	}
	for m > 1 {
		minRank, k := int32(noRank), -1
		for x := 0; x < m-1; x++ {
			if rank[x] < minRank {
				minRank, k = rank[x], x
			}
		}
		if k < 0 {
			break
		}
		// Part k absorbs part k+1: the ranks of k and k-1 now span one
		// part further.
		rank[k] = noRank
		if k+3 < m {
			rank[k] = b.rank(p[start[k]:start[k+3]])
		}
		if k > 0 {
			rank[k-1] = noRank
			if k+2 < m {
				rank[k-1] = b.rank(p[start[k-1]:start[k+2]])
			}
		}
		copy(start[k+1:m-1], start[k+2:m])
		copy(rank[k+1:m-1], rank[k+2:m])
		m--
	}
	return m - 1
}

// mergeLarge merges like mergeSmall in O(n log n): parts are a linked
// list over the byte offsets, the candidate merges a heap ordered by rank
// then offset (the order of the scan: the lowest rank, the leftmost on
// ties). An entry is stale when its part is gone or its rank changed; a
// part's rank can never return to an old value (its span only grows, and
// a rank names one byte string), so comparing ranks detects it.
func (b *bpe) mergeLarge(p string) int {
	s := largePool.Get().(*largeScratch)
	n := len(p)
	if n <= maxPooled {
		// The scratch of a huge piece is left to the collector.
		defer largePool.Put(s)
	}
	s.reset(n)
	next, prev, rank := s.next, s.prev, s.rank
	for k := 0; k+2 <= n; k++ {
		if r := b.rank(p[k : k+2]); r != noRank {
			rank[k] = r
			s.h.push(cand{r, int32(k)})
		}
	}
	count := n
	for len(s.h) > 0 {
		c := s.h.pop()
		k := c.at
		if next[k] < 0 || rank[k] != c.rank {
			continue // merged away, or re-ranked
		}
		// Part k absorbs its successor j.
		j := next[k]
		nj := next[j]
		next[k], next[j] = nj, -1
		prev[nj] = k
		count--
		rank[k] = noRank
		if nj < int32(n) {
			if r := b.rank(p[k:next[nj]]); r != noRank {
				rank[k] = r
				s.h.push(cand{r, k})
			}
		}
		if pk := prev[k]; pk >= 0 {
			rank[pk] = noRank
			if r := b.rank(p[pk:nj]); r != noRank {
				rank[pk] = r
				s.h.push(cand{r, pk})
			}
		}
	}
	return count
}

// cand is a candidate merge: of the part at byte offset at with its
// successor, of rank rank.
type cand struct{ rank, at int32 }

func (c cand) less(d cand) bool {
	return c.rank < d.rank || c.rank == d.rank && c.at < d.at
}

// candHeap is a binary min-heap of candidates (container/heap would box
// every entry).
type candHeap []cand

func (h *candHeap) push(c cand) {
	*h = append(*h, c)
	a := *h
	for k := len(a) - 1; k > 0; {
		up := (k - 1) / 2
		if !a[k].less(a[up]) {
			break
		}
		a[k], a[up] = a[up], a[k]
		k = up
	}
}

func (h *candHeap) pop() cand {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for k := 0; ; {
		l := 2*k + 1
		if l >= len(a) {
			break
		}
		m := l
		if r := l + 1; r < len(a) && a[r].less(a[l]) {
			m = r
		}
		if !a[m].less(a[k]) {
			break
		}
		a[k], a[m] = a[m], a[k]
		k = m
	}
	*h = a
	return top
}

// largeScratch is mergeLarge's memory, indexed by byte offset (the part
// starting there): next and prev offsets (-1: none, n: the end), rank.
type largeScratch struct {
	next, prev, rank []int32
	h                candHeap
}

func (s *largeScratch) reset(n int) {
	if cap(s.next) < n+1 {
		s.next = make([]int32, n+1)
		s.prev = make([]int32, n+1)
		s.rank = make([]int32, n+1)
	}
	s.next, s.prev, s.rank = s.next[:n+1], s.prev[:n+1], s.rank[:n+1]
	for k := range n + 1 {
		s.next[k] = int32(k + 1)
		s.prev[k] = int32(k - 1)
		s.rank[k] = noRank
	}
	s.next[n] = int32(n) // the end: alive, no successor
	s.h = s.h[:0]
}

var largePool = sync.Pool{New: func() any { return new(largeScratch) }}

// maxPooled bounds the pieces whose scratch (some 20 bytes a byte)
// returns to the pool.
const maxPooled = 1 << 16
