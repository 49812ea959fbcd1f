package deploy

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY...
	args string
}

// stage is one FROM ... AS name block.
type stage struct {
	name, from string
	ins        []instruction
}

func (s *stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// parseDockerfile reads the Dockerfile's stages and the global ARG
// defaults (those before the first FROM), substituted into FROM lines.
func parseDockerfile(t *testing.T) (map[string]*stage, []*stage) {
	t.Helper()
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(string(read(t, dockerfile)), "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	globals := map[string]string{}
	byName := map[string]*stage{}
	var order []*stage
	var s *stage
	for _, l := range lines {
		cmd, args, _ := strings.Cut(l, " ")
		cmd, args = strings.ToUpper(cmd), strings.TrimSpace(args)
		if cmd == "ARG" && s == nil {
			k, v, _ := strings.Cut(args, "=")
			globals[k] = v
			continue
		}
		if cmd == "FROM" {
			f := strings.Fields(args)
			f = slices.DeleteFunc(f, func(x string) bool { return strings.HasPrefix(x, "--") })
			s = &stage{from: os.Expand(f[0], func(k string) string { return globals[k] })}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
				byName[s.name] = s
			}
			order = append(order, s)
			continue
		}
		if s == nil {
			t.Fatalf("Dockerfile: %s before the first FROM", cmd)
		}
		s.ins = append(s.ins, instruction{cmd, args})
	}
	return byName, order
}

func dockerfileStages(t *testing.T) map[string]*stage {
	t.Helper()
	s, _ := parseDockerfile(t)
	return s
}

// dockerfileUser is the numeric user the runtime images run as.
func dockerfileUser(t *testing.T) int64 {
	t.Helper()
	stages := dockerfileStages(t)
	var uid int64 = -1
	for _, name := range []string{"gateway", "worker"} {
		users := stages[name].all("USER")
		if len(users) != 1 {
			t.Fatalf("Dockerfile stage %s: %d USER instructions, want 1", name, len(users))
		}
		u, _, _ := strings.Cut(users[0], ":")
		n, err := strconv.ParseInt(u, 10, 64)
		if err != nil {
			t.Fatalf("Dockerfile stage %s: USER %q should be numeric, so Kubernetes can check runAsNonRoot", name, users[0])
		}
		if uid >= 0 && n != uid {
			t.Fatalf("the images run as different users (%d, %d)", uid, n)
		}
		uid = n
	}
	return uid
}

// shellWords splits a command line on blanks, honouring double quotes.
func shellWords(s string) []string {
	var out []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, w.String())
	}
	return out
}

// goBuild returns the build stage's `go build` arguments and environment.
func goBuild(t *testing.T, buildStage *stage) (args, env []string) {
	t.Helper()
	for _, e := range buildStage.all("ENV") {
		env = append(env, strings.Fields(e)...)
	}
	for _, run := range buildStage.all("RUN") {
		if _, rest, ok := strings.Cut(run, "go build "); ok {
			return shellWords(rest), env
		}
	}
	t.Fatal("Dockerfile: no `go build` in the build stage")
	return nil, nil
}

// builtPackages returns the packages the go build arguments name.
func builtPackages(args []string) []string {
	var pkgs []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-o" || a == "-ldflags" || a == "-tags":
			i++
		case strings.HasPrefix(a, "./"):
			pkgs = append(pkgs, a)
		}
	}
	return pkgs
}

func TestDockerfile(t *testing.T) {
	stages, order := parseDockerfile(t)
	buildStage := stages["build"]
	if buildStage == nil || order[0] != buildStage {
		t.Fatal("Dockerfile: the first stage should be the build stage, named build")
	}
	goVersion, _ := goMod(t)
	if want := "golang:" + minor(goVersion) + "-"; !strings.HasPrefix(buildStage.from, want) {
		t.Errorf("build stage FROM %s, want %s* (go.mod says go %s)", buildStage.from, want, goVersion)
	}

	args, env := goBuild(t, buildStage)
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Error("the build stage must set CGO_ENABLED=0: the runtime image has no C library")
	}
	if !slices.Contains(args, "-trimpath") || !slices.Contains(args, "-ldflags=-s -w") {
		t.Errorf("go build %v: want -trimpath and -ldflags=\"-s -w\"", args)
	}
	outDir, ok := flagValue(args, "o")
	if !ok || !strings.HasSuffix(outDir, "/") {
		t.Fatalf("go build %v: want -o <dir>/ for several binaries", args)
	}
	pkgs := builtPackages(args)
	var binaries []string
	for _, p := range pkgs {
		bp, err := build.Default.ImportDir(filepath.Join(repoRoot, p), 0)
		if err != nil || bp.Name != "main" {
			t.Errorf("go build names %s, which is not a command package (%v)", p, err)
		}
		binaries = append(binaries, filepath.Base(p))
	}
	for _, want := range []string{"gateway", "worker", "healthcheck"} {
		if !slices.Contains(binaries, want) {
			t.Errorf("go build does not build %s", want)
		}
	}

	for _, name := range []string{"gateway", "worker"} {
		s := stages[name]
		if s == nil {
			t.Errorf("Dockerfile has no %s stage", name)
			continue
		}
		if !strings.HasPrefix(s.from, "gcr.io/distroless/static") && s.from != "scratch" {
			t.Errorf("%s: FROM %s, want distroless/static or scratch", name, s.from)
		}
		if uid := dockerfileUser(t); uid == 0 {
			t.Errorf("%s: runs as root", name)
		}
		// Binaries come from the build output, and the entrypoint is this
		// stage's command; compose's healthcheck binary is there too.
		copied := map[string]string{}
		for _, c := range s.all("COPY") {
			f := strings.Fields(c)
			if len(f) != 3 || f[0] != "--from=build" || !strings.HasPrefix(f[1], outDir) || !slices.Contains(binaries, strings.TrimPrefix(f[1], outDir)) {
				t.Errorf("%s: COPY %s: want COPY --from=build %s<binary> <path>", name, c, outDir)
				continue
			}
			copied[f[2]] = strings.TrimPrefix(f[1], outDir)
		}
		var entry []string
		if e := s.all("ENTRYPOINT"); len(e) != 1 || json.Unmarshal([]byte(e[0]), &entry) != nil || len(entry) != 1 {
			t.Errorf("%s: want one exec-form ENTRYPOINT [\"/path\"], got %v", name, e)
		} else if copied[entry[0]] != name {
			t.Errorf("%s: ENTRYPOINT %s is not the %s binary", name, entry[0], name)
		}
		if copied["/usr/local/bin/healthcheck"] != "healthcheck" {
			t.Errorf("%s: no /usr/local/bin/healthcheck for compose's healthcheck", name)
		}
		// The default command listens beyond loopback on the exposed port.
		var cmd []string
		if c := s.all("CMD"); len(c) != 1 || json.Unmarshal([]byte(c[0]), &cmd) != nil {
			t.Errorf("%s: want one exec-form CMD, got %v", name, c)
			continue
		}
		listen, ok := flagValue(cmd, "listen")
		if expose := s.all("EXPOSE"); !ok || len(expose) != 1 || strings.HasPrefix(listen, "127.") || expose[0] != strconv.Itoa(portOf(t, listen)) {
			t.Errorf("%s: CMD %v and EXPOSE %v: want --listen on all interfaces at the exposed port", name, cmd, expose)
		}
	}
}

// staticELF reports why the binary at path is not a static executable.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s has a program interpreter (dynamically linked)", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v", path, libs)
	}
	return nil
}

// TestBinariesBuildStatic runs the Dockerfile's own go build line (its
// flags and environment; only the output directory moves) and checks that
// every binary is a static ELF: distroless/static has no C library.
func TestBinariesBuildStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the images are linux binaries")
	}
	// The check itself tells a dynamic binary from a static one: a shell
	// that names the dynamic loader must fail it.
	if sh, err := os.ReadFile("/bin/sh"); err == nil && strings.Contains(string(sh), "/ld-linux") {
		if staticELF("/bin/sh") == nil {
			t.Fatal("staticELF passed /bin/sh, a dynamically linked binary")
		}
	}

	args, env := goBuild(t, dockerfileStages(t)["build"])
	out := t.TempDir() + "/"
	for i, a := range args {
		if a == "-o" {
			args[i+1] = out
		}
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if p, err := exec.LookPath("go"); err == nil {
		gobin = p
	}
	cmd := exec.Command(gobin, append([]string{"build"}, args...)...)
	cmd.Dir = repoRoot
	cmd.Env = append(append(os.Environ(), env...), "GOOS=linux", "GOARCH="+runtime.GOARCH)
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, b)
	}
	t.Logf("go build took %s", time.Since(start).Round(time.Millisecond))
	for _, p := range builtPackages(args) {
		if err := staticELF(filepath.Join(out, filepath.Base(p))); err != nil {
			t.Error(err)
		}
	}
}
