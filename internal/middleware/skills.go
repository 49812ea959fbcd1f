package middleware

// Skills. Boundary: prompt and tools offered (request only), tool call,
// state. Reads the state value "activated_skills" and, once per run, the
// user's skills in the workdir (/skills/<slug>/SKILL.md); writes
// "activated_skills" (a sorted list of names); emits state.skills
// (updates kind) when it changes. Each request lists the skills (name,
// description, path) in the system prompt, with the instructions of
// preloaded skills. A read_file of a shared skill's files is answered from
// the shared skills directory, read-only, never touching the workdir; a
// successful read of a skill's SKILL.md activates the skill. A skill's
// dependency tools that the agent's profile does not grant are hidden from
// the model and refused by name until one skill needing them is active;
// then they are offered and run from the deployment's tool registry. Only
// shared skills have dependency tools: a workdir SKILL.md is text for the
// model, and its tools field is ignored.
//
// Activation is a union, never a replacement: parallel reads in one tool
// batch each write the union they know, and the tool result of every
// activation carries a marker, so the next before-model hook (or the
// after-agent hook when the run ends there) completes the union from the
// batch's results. That also holds after a worker loss between the batch's
// checkpoint and the next model call.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/skills"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// SkillsValue is the state value listing the activated skills by name.
const SkillsValue = "activated_skills"

// EventSkillsActivated is emitted with {"activated": [...]} when the set of
// activated skills changes.
const EventSkillsActivated = "state.skills"

// MetaActivatedSkill marks the tool result of the read that activated a
// skill; its value is the skill's name.
const MetaActivatedSkill = "activated_skill"

// ReadFileTool is the tool a skill is read with.
const ReadFileTool = tools.ToolReadFile

// Limits of what the skills middleware shows and serves.
const (
	// maxListedSkills bounds the skills listed in the prompt.
	maxListedSkills = 100
	// maxSkillFileBytes bounds a file of a shared skill's directory.
	maxSkillFileBytes = 1 << 20
)

// Skills gives the model skills: instructions it reads on demand, and
// the tools that come with them.
type Skills struct {
	// Dir is the shared skills directory; empty for user skills only.
	Dir string `json:"dir"`
	// Preload names shared skills active from a run's first call, their
	// instructions in the prompt.
	Preload []string `json:"preload"`

	shared   []*skills.Skill
	registry *tools.Registry
	// reader is the file tools' read_file, which formats what this
	// middleware serves; readSpec offers it for skill files only to a run
	// without a read_file tool.
	reader   tools.Tool
	readSpec model.ToolSpec
}

// NewSkills loads the shared skills and checks them against the
// deployment's tool registry: a broken SKILL.md, two skills with one name
// or slug, a dependency tool the registry lacks, or an unknown preload
// name stops the start with the path at fault.
func NewSkills(s Skills, registry *tools.Registry) (*Skills, error) {
	s.registry = registry
	for _, t := range tools.FileTools() {
		if t.Spec().Name == tools.ToolReadFile {
			s.reader = t
		}
	}
	if s.reader == nil {
		return nil, fmt.Errorf("the file tools have no %s", tools.ToolReadFile)
	}
	s.readSpec = s.reader.Spec()
	s.readSpec.Description = "Reads a skill file (under /skills/<skill>/). Lines come numbered like `cat -n`; pass offset (first line, from 1) and limit to read a part."
	if s.Dir != "" {
		shared, err := skills.LoadDir(s.Dir)
		if err != nil {
			return nil, fmt.Errorf("dir: %w", err)
		}
		for _, sk := range shared {
			for _, t := range sk.Tools {
				if err := s.checkTool(sk, t); err != nil {
					return nil, fmt.Errorf("dir: %w", err)
				}
			}
		}
		s.shared = shared
	}
	var preload []string
	for i, name := range s.Preload {
		if !slices.ContainsFunc(s.shared, func(sk *skills.Skill) bool { return sk.Name == name }) {
			names := make([]string, len(s.shared))
			for j, sk := range s.shared {
				names[j] = sk.Name
			}
			if s.Dir == "" {
				return nil, fmt.Errorf("preload[%d]: %q: preloading needs shared skills; set dir", i, name)
			}
			return nil, fmt.Errorf("preload[%d]: unknown skill %q (shared skills in %s: %s)", i, name, s.Dir, strings.Join(names, ", "))
		}
		if !slices.Contains(preload, name) {
			preload = append(preload, name)
		}
	}
	s.Preload = preload
	return &s, nil
}

// checkTool checks one dependency tool of a skill against the registry.
func (s *Skills) checkTool(sk *skills.Skill, name string) error {
	if name == ReadFileTool {
		return fmt.Errorf("skill %s: tools: %s is how a skill is read; a skill cannot depend on it", sk.File, name)
	}
	if s.registry == nil || s.registry.Get(name) == nil {
		var known string
		if s.registry != nil {
			known = strings.Join(s.registry.Names(), ", ")
		}
		return fmt.Errorf("skill %s: tools: %q is not a tool of this deployment (known tools: %s)", sk.File, name, known)
	}
	return nil
}

// Name implements Middleware.
func (*Skills) Name() string { return "skills" }

func (s *Skills) tool(name string) tools.Tool {
	if s.registry == nil {
		return nil
	}
	return s.registry.Get(name)
}

// runSkills is a run's view of its skills, resolved once per run.
type runSkills struct {
	once   sync.Once
	err    error
	all    []*skills.Skill
	bySlug map[string]*skills.Skill
	byName map[string]*skills.Skill
	// gated maps each dependency tool the profile does not grant to the
	// skills that bring it.
	gated map[string][]*skills.Skill

	mu sync.Mutex
	// activated holds what this run's reads activated, so parallel reads
	// of one batch write the union they know.
	activated map[string]bool
}

// view returns the run's skills: the shared ones and the user's own from
// the workdir, listed once per run. A user skill that does not parse,
// clashes with another, or needs a tool the agent may not use is a run
// error naming its path.
func (s *Skills) view(ctx context.Context, rt *Runtime) (*runSkills, error) {
	v := Scratch(rt, "skills", func() *runSkills { return &runSkills{} })
	v.once.Do(func() { v.err = s.resolve(ctx, rt, v) })
	return v, v.err
}

func (s *Skills) resolve(ctx context.Context, rt *Runtime, v *runSkills) error {
	user, err := skills.LoadWorkdir(ctx, rt.Files)
	if err != nil {
		return fmt.Errorf("user skills: %w", err)
	}
	for _, sk := range user {
		// A workdir file is text for the model, written by a user or by
		// the model itself: whatever tools it names, it never gates,
		// grants or unlocks one. Only the deployment's shared skills
		// change which tools a run has.
		sk.Tools = nil
	}
	all, err := skills.Merge(s.shared, user)
	if err != nil {
		return fmt.Errorf("user skills: %w", err)
	}
	v.all = all
	v.activated = make(map[string]bool)
	if len(all) == 0 {
		return nil // nothing to index: lookups in the nil maps find nothing
	}
	v.bySlug = make(map[string]*skills.Skill, len(all))
	v.byName = make(map[string]*skills.Skill, len(all))
	v.gated = make(map[string][]*skills.Skill)
	for _, sk := range all {
		v.bySlug[sk.Slug], v.byName[sk.Name] = sk, sk
		for _, t := range sk.Tools {
			if rt.Tools.Get(t) == nil {
				v.gated[t] = append(v.gated[t], sk)
			}
		}
	}
	return nil
}

// activated returns the names of the active skills: the state's list and
// the preloaded ones.
func (s *Skills) activated(st *state.State) []string {
	var names []string
	if st != nil {
		_, _ = st.Value(SkillsValue, &names)
	}
	return union(names, s.Preload)
}

func union(a []string, b ...[]string) []string {
	out := slices.Clone(a)
	for _, l := range b {
		for _, n := range l {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// setActivated is the update and event of a new activated list.
func setActivated(rt *Runtime, names []string) state.Update {
	u, _ := state.SetValue(SkillsValue, names)
	if rt.Emit != nil {
		rt.Emit(EventSkillsActivated, map[string]any{"activated": names})
	}
	return u
}

// BeforeAgent lists the user's skills, activates the preloaded ones and
// the one the run's user message names with /name (skillslash.go).
func (s *Skills) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	v, err := s.view(ctx, rt)
	if err != nil {
		return Result{}, err
	}
	msg, name, ok := slashActivation(rt, st, v)
	if !ok {
		return s.reconcile(rt, st, s.Preload), nil
	}
	res := s.reconcile(rt, st, append(slices.Clone(s.Preload), name))
	res.Update.Messages = append(res.Update.Messages, msg)
	if rt.Emit != nil {
		rt.Emit(EventSkillSlash, map[string]any{"skill": name, "message_id": msg.ID})
	}
	return res, nil
}

// EventSkillSlash is emitted with {"skill", "message_id"} when a user's
// /name activated a skill.
const EventSkillSlash = "skill.activated"

// BeforeModel completes the union of the skills the last tool batch
// activated.
func (s *Skills) BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return s.reconcile(rt, st, batchActivations(st)), nil
}

// AfterAgent does the same when the run ends right after a tool batch.
func (s *Skills) AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return s.reconcile(rt, st, batchActivations(st)), nil
}

// batchActivations returns the skills the results after the last
// assistant message activated.
func batchActivations(st *state.State) []string {
	var out []string
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := st.Messages[i]
		if m.Role == model.RoleAssistant {
			break
		}
		if name, _ := m.Meta[MetaActivatedSkill].(string); name != "" && m.Role == model.RoleTool {
			out = append(out, name)
		}
	}
	return out
}

func (s *Skills) reconcile(rt *Runtime, st *state.State, add []string) Result {
	if len(add) == 0 {
		return Result{}
	}
	var current []string
	_, _ = st.Value(SkillsValue, &current)
	next := union(current, add)
	if slices.Equal(next, current) {
		return Result{}
	}
	return Result{Update: setActivated(rt, next)}
}

// WrapModelCall lists the skills in the system prompt and offers the tools
// of the active ones.
func (s *Skills) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	// The request is built in request, which has returned by the time the
	// model answers: a wrapper's frame stays on the run's stack for the
	// whole call (chain.go, "Frames").
	c, err := s.request(ctx, rt, req)
	if err != nil {
		return nil, err
	}
	return next(ctx, c)
}

// request is the model call's request with the skills' tools and prompt.
func (s *Skills) request(ctx context.Context, rt *Runtime, req *ModelRequest) (*ModelRequest, error) {
	v, err := s.view(ctx, rt)
	if err != nil {
		return nil, err
	}
	if len(v.all) == 0 {
		return req, nil
	}
	active := s.activated(req.State)
	c := *req
	c.Tools = make([]model.ToolSpec, 0, len(req.Tools)+4)
	offered := make(map[string]bool, len(req.Tools))
	for _, spec := range req.Tools {
		if gateOf(v, spec.Name, active) == needsActivation {
			continue
		}
		offered[spec.Name] = true
		c.Tools = append(c.Tools, spec)
	}
	for _, name := range active {
		sk := v.byName[name]
		if sk == nil {
			continue
		}
		for _, t := range sk.Tools {
			if offered[t] || rt.Tools.Get(t) != nil {
				continue
			}
			if tool := s.tool(t); tool != nil {
				offered[t] = true
				c.Tools = append(c.Tools, tool.Spec())
			}
		}
	}
	if !offered[ReadFileTool] {
		c.Tools = append(c.Tools, s.readSpec)
	}
	// The list marks the skills active when the run's first call was
	// made: one read later in the run leaves the system prompt, and so
	// the provider's cached prefix, as it was (promptcontext.go); the
	// tools it unlocks are offered from the next call all the same.
	listed := Scratch(rt, "skills:listed", func() []string { return active })
	c.appendShared(s.prompt(v, listed))
	return &c, nil
}

// prompt is the skills section of the system prompt.
func (s *Skills) prompt(v *runSkills, active []string) string {
	var b strings.Builder
	b.WriteString("## Skills\n\nSkills hold instructions for particular tasks. Before you work on a task a skill covers, read its SKILL.md with read_file and follow it; the tools a skill lists become available once you have read it.\n")
	for i, sk := range v.all {
		if i == maxListedSkills {
			fmt.Fprintf(&b, "- ... and %d more skills under %s, not listed here.\n", len(v.all)-i, skills.Root)
			break
		}
		mark := ""
		if slices.Contains(active, sk.Name) {
			mark = " (active)"
		}
		fmt.Fprintf(&b, "- %s%s: %s\n  Read %s", sk.Name, mark, oneLine(sk.Description), sk.Path())
		if len(sk.Tools) > 0 {
			fmt.Fprintf(&b, " (tools: %s)", strings.Join(sk.Tools, ", "))
		}
		b.WriteString("\n")
	}
	for _, name := range s.Preload {
		sk := v.byName[name]
		fmt.Fprintf(&b, "\n<preloaded_skill name=%q path=%q>\nThese instructions are already loaded and the skill is active.\n%s\n</preloaded_skill>\n", sk.Name, sk.Path(), strings.TrimSpace(sk.Body))
	}
	return strings.TrimRight(b.String(), "\n")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

type gate int

const (
	notGated gate = iota
	unlocked
	needsActivation
)

// gateOf tells whether tool is a gated dependency and whether one of
// the skills bringing it is active.
func gateOf(v *runSkills, tool string, active []string) gate {
	need, ok := v.gated[tool]
	if !ok {
		return notGated
	}
	for _, sk := range need {
		if slices.Contains(active, sk.Name) {
			return unlocked
		}
	}
	return needsActivation
}

// fileWriteTools are the tools that change a workdir file; they may not
// write inside a shared skill's directory, which is read-only (and a copy
// in the workdir would clash with the shared skill).
var fileWriteTools = map[string]bool{tools.ToolWriteFile: true, tools.ToolEditFile: true}

// WrapToolCall serves shared skill files, activates skills and enforces
// the gate of their tools.
func (s *Skills) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	v, err := s.view(ctx, rt)
	if err != nil {
		return nil, err
	}
	if len(v.all) == 0 {
		return next(ctx, call)
	}
	name := call.Call.Name
	switch {
	case name == ReadFileTool:
		return s.readFile(ctx, rt, v, call, next)
	case fileWriteTools[name]:
		if p, err := pathArg(call.Call.Arguments); err == nil {
			if slug, _, in := skills.SplitPath(p); in && v.bySlug[slug] != nil && v.bySlug[slug].Source == skills.SourceShared {
				return errorResult(fmt.Sprintf("Error: %s/%s is a shared skill and read-only; write your own files elsewhere.", skills.Root, slug)), nil
			}
		}
	}
	switch gateOf(v, name, s.activated(call.State)) {
	case needsActivation:
		need := v.gated[name]
		paths := make([]string, len(need))
		names := make([]string, len(need))
		for i, sk := range need {
			paths[i], names[i] = sk.Path(), sk.Name
		}
		return errorResult(fmt.Sprintf("Error: %s comes with the skill %s. Read %s with read_file first, then call %s.",
			name, strings.Join(names, " or "), strings.Join(paths, " or "), name)), nil
	case unlocked:
		if call.Tool == nil {
			c := *call
			c.Tool = s.tool(name)
			call = &c
		}
	}
	return next(ctx, call)
}

func errorResult(text string) *ToolResult {
	return &ToolResult{Message: model.Message{Content: text, Status: model.ToolStatusError}}
}

// pathArg is the path argument of a file tool ("path", or "file_path"
// as other harnesses name it), cleaned.
func pathArg(raw string) (string, error) {
	var a struct {
		Path     string `json:"path"`
		FilePath string `json:"file_path"`
	}
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		return "", fmt.Errorf("the arguments must be a JSON object such as {\"path\": \"%s/<skill>/SKILL.md\"}: %v", skills.Root, err)
	}
	return files.Clean(cmp.Or(a.Path, a.FilePath))
}

// readFile answers reads of shared skill files, and of any skill file when
// the run has no read_file tool; other reads go on to the tool. A
// successful read of a skill's SKILL.md activates the skill.
func (s *Skills) readFile(ctx context.Context, rt *Runtime, v *runSkills, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	own := call.Tool == nil // no read_file tool: this middleware is the tool
	p, err := pathArg(call.Call.Arguments)
	if err != nil {
		// Every workdir refuses such a path the same way.
		return errorResult("Error: " + err.Error()), nil
	}
	slug, rel, inSkills := skills.SplitPath(p)
	sk := v.bySlug[slug]
	if !inSkills || sk == nil {
		if own {
			return errorResult(fmt.Sprintf("Error: %s: this run can read only skill files with read_file (under %s/<skill>/).", p, skills.Root)), nil
		}
		return next(ctx, call)
	}

	var res *ToolResult
	switch {
	case sk.Source == skills.SourceShared:
		data, err := skills.ReadShared(sk, rel, maxSkillFileBytes)
		if err != nil {
			return errorResult("Error: " + err.Error()), nil
		}
		// The file tool formats it, so a skill reads like any file.
		view := files.NewMemory()
		if err := view.Write(ctx, p, data); err != nil {
			return nil, err
		}
		res, err = s.serve(ctx, call, view)
		if err != nil {
			return nil, err
		}
	case own:
		wd := rt.Files
		if call.Env != nil && call.Env.Files != nil {
			wd = call.Env.Files
		}
		if wd == nil {
			return errorResult("Error: " + tools.ErrNoWorkdir.Error()), nil
		}
		res, err = s.serve(ctx, call, wd)
		if err != nil {
			return nil, err
		}
	default:
		res, err = next(ctx, call)
		if err != nil || res == nil {
			return res, err
		}
	}
	if res.Message.Status == model.ToolStatusError || rel != skills.FileName {
		return res, nil
	}
	return s.activate(rt, v, call, res, sk.Name), nil
}

// serve runs the file tools' read_file on wd.
func (s *Skills) serve(ctx context.Context, call *ToolCall, wd files.Workdir) (*ToolResult, error) {
	args := json.RawMessage(call.Call.Arguments)
	out, err := s.reader.Call(ctx, &tools.Call{ID: call.Call.ID, Name: call.Call.Name, Args: args, Env: &tools.Env{Files: wd}})
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return errorResult("Error: " + err.Error()), nil
	}
	status := model.ToolStatusSuccess
	if out.Error {
		status = model.ToolStatusError
	}
	return &ToolResult{Message: model.Message{Content: out.Content, Status: status}}, nil
}

// activate adds name to the activated skills with the read's result.
func (s *Skills) activate(rt *Runtime, v *runSkills, call *ToolCall, res *ToolResult, name string) *ToolResult {
	var stored []string
	if call.State != nil {
		_, _ = call.State.Value(SkillsValue, &stored)
	}
	if slices.Contains(stored, name) {
		return res
	}
	v.mu.Lock()
	v.activated[name] = true
	known := make([]string, 0, len(v.activated))
	for n := range v.activated {
		known = append(known, n)
	}
	v.mu.Unlock()
	out := *res
	out.Message = res.Message.Clone()
	if out.Message.Meta == nil {
		out.Message.Meta = map[string]any{}
	}
	out.Message.Meta[MetaActivatedSkill] = name
	out.Update = state.Update{}
	out.Update.Merge(res.Update)
	out.Update.Merge(setActivated(rt, union(stored, known)))
	return &out
}
