// Package suggest finds the name a person probably meant when they wrote
// one that does not exist ("replicaz: did you mean replicas?"). The
// configuration, the middleware settings and the profile checks share it.
package suggest

import (
	"slices"
	"strings"
)

// Nearest is the candidate closest to s by edit distance, when it is close
// enough to be a typo (at most a third of its length, and at most 3), or
// when s is a prefix of exactly one candidate; "" when none is.
func Nearest(s string, candidates []string) string {
	best, bestDist := "", 4
	low := strings.ToLower(s)
	for _, c := range candidates {
		if d := editDistance(low, c); d < bestDist && d <= max(1, len(c)/3) {
			best, bestDist = c, d
		}
	}
	if best == "" && len(s) >= 3 {
		var prefixed []string
		for _, c := range candidates {
			if strings.HasPrefix(c, low) {
				prefixed = append(prefixed, c)
			}
		}
		if len(prefixed) == 1 {
			best = prefixed[0]
		}
	}
	return best
}

// DidYouMean is "; did you mean <nearest>?" when a candidate is close to
// s, else "".
func DidYouMean(s string, candidates []string) string {
	if n := Nearest(s, candidates); n != "" && n != s {
		return "; did you mean " + n + "?"
	}
	return ""
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
