package agent

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/suggest"
)

// subagentCatalog resolves, for every lead profile, the subagents it may
// start: those its Subagents list names (each must be a subagent profile),
// or every subagent profile when the list is nil. An empty, non-nil list
// gives it none. A subagent profile may start none (no nesting).
func subagentCatalog(profiles []Profile) (map[string][]middleware.SubagentInfo, []error) {
	var errs []error
	subs := make(map[string]middleware.SubagentInfo)
	for _, p := range profiles {
		if p.Kind == middleware.KindSubagent {
			subs[p.Name] = middleware.SubagentInfo{Name: p.Name, Description: p.Description}
		}
	}
	all := make([]string, 0, len(subs))
	for n := range subs {
		all = append(all, n)
	}
	sort.Strings(all)
	out := make(map[string][]middleware.SubagentInfo)
	for _, p := range profiles {
		if p.Kind == middleware.KindSubagent {
			if len(p.Subagents) > 0 {
				errs = append(errs, &ProfileError{Profile: p.Name, Path: "subagents", Err: errors.New("a subagent cannot start subagents (no nesting)")})
			}
			continue
		}
		names := p.Subagents
		if names == nil {
			names = all
		}
		var list []middleware.SubagentInfo
		for i, n := range names {
			info, ok := subs[n]
			if !ok {
				known := "none is defined: add a profile with kind: subagent"
				if len(all) > 0 {
					known = "the subagent profiles are " + strings.Join(all, ", ")
				}
				errs = append(errs, &ProfileError{Profile: p.Name, Path: fmt.Sprintf("subagents[%d]", i),
					Err: fmt.Errorf("%q is not a subagent profile%s (%s)", n, suggest.DidYouMean(n, all), known)})
				continue
			}
			if !slices.ContainsFunc(list, func(i middleware.SubagentInfo) bool { return i.Name == n }) {
				list = append(list, info)
			}
		}
		out[p.Name] = list
	}
	return out, errs
}

// Subagents lists the subagents a lead profile may start (none for a
// subagent or an unknown profile).
func (a *Agents) Subagents(lead string) []middleware.SubagentInfo {
	return slices.Clone(a.subagents[lead])
}

// MaySpawn reports whether the lead profile may start the named subagent,
// and which ones it may start.
func (a *Agents) MaySpawn(lead, subagent string) (bool, []string) {
	var names []string
	ok := false
	for _, s := range a.subagents[lead] {
		names = append(names, s.Name)
		ok = ok || s.Name == subagent
	}
	return ok, names
}
