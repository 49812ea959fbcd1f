package remotetools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// infoSubject reaches every micro service's INFO handler.
const infoSubject = micro.APIPrefix + ".INFO"

// MaxDescriptionLen bounds a tool's description (bytes): it is sent with
// every model request that offers the tool.
const MaxDescriptionLen = 4096

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,` + strconv.Itoa(MaxNameLen) + `}$`)

// ValidName reports whether name may name a remote tool's endpoint.
func ValidName(name string) bool { return validName.MatchString(name) }

// noArguments is the schema of a tool whose endpoint declares none.
var noArguments = json.RawMessage(`{"type":"object","properties":{}}`)

// gather sends one $SRV.INFO request and collects the answers that arrive
// within the window. Micro services answer it whatever their name, so one
// request finds them all; the marker in their metadata tells ours.
func (c *Catalog) gather(ctx context.Context) ([]micro.Info, error) {
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("discover remote tools: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishRequest(infoSubject, inbox, nil); err != nil {
		return nil, fmt.Errorf("discover remote tools: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, c.opts.Window)
	defer cancel()
	var infos []micro.Info
	for {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if wctx.Err() != nil {
				return infos, nil
			}
			if errors.Is(err, nats.ErrNoResponders) {
				// No micro service at all.
				return infos, nil
			}
			return nil, fmt.Errorf("discover remote tools: %w", err)
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil || info.Type != micro.InfoResponseType {
			continue
		}
		infos = append(infos, info)
	}
}

// issue is a problem with a served endpoint, logged once while it lasts.
type issue struct {
	id     string
	msg    string
	fields []zap.Field
}

type candidate struct {
	tool    *Tool
	version string
	id      string
}

// build turns the answers into tools. Endpoints that break the contract
// are skipped with an issue; a (tenant, name) served by two different
// services is refused (neither is offered): NATS would spread the calls
// over both, so the tool the model sees is not the one it calls.
func (c *Catalog) build(infos []micro.Info) (found map[key]*Tool, refused map[key]bool, issues []issue) {
	byKey := make(map[key][]candidate)
	for _, info := range infos {
		if info.Metadata[MetaService] != ServiceTools {
			continue
		}
		for _, ep := range info.Endpoints {
			t, problem := c.endpoint(info, ep)
			if problem != "" {
				if problem == otherDeployment {
					continue
				}
				issues = append(issues, issue{
					id:  info.ID + "\x00" + ep.Name + "\x00" + ep.Subject + "\x00" + problem,
					msg: "remote tool endpoint skipped: " + problem,
					fields: []zap.Field{zap.String("service", info.Name), zap.String("service_id", info.ID),
						zap.String("endpoint", ep.Name), zap.String("subject", ep.Subject)},
				})
				continue
			}
			k := key{t.tenant, t.name}
			byKey[k] = append(byKey[k], candidate{tool: t, version: info.Version, id: info.ID})
		}
	}
	found, refused = make(map[key]*Tool), make(map[key]bool)
	for k, cands := range byKey {
		services := make([]string, 0, len(cands))
		for _, cd := range cands {
			if !slices.Contains(services, cd.tool.service) {
				services = append(services, cd.tool.service)
			}
		}
		if len(services) > 1 {
			slices.Sort(services)
			refused[k] = true
			issues = append(issues, issue{
				id:  "conflict\x00" + k.tenant + "\x00" + k.name + "\x00" + strings.Join(services, ","),
				msg: "remote tool refused: several services serve it; stop all but one",
				fields: []zap.Field{zap.String("tenant", k.tenant), zap.String("tool", Prefix+k.name),
					zap.Strings("services", services)},
			})
			continue
		}
		// Instances of one service: the newest version's description
		// wins (a rolling upgrade), then the lowest instance id, so every
		// worker picks the same.
		slices.SortFunc(cands, func(a, b candidate) int {
			if v := compareVersions(b.version, a.version); v != 0 {
				return v
			}
			return strings.Compare(a.id, b.id)
		})
		found[k] = cands[0].tool
	}
	return found, refused, issues
}

// otherDeployment marks an endpoint of another prefix's tools: a second
// deployment sharing the account, not a problem of this one.
const otherDeployment = "\x00other"

// endpoint checks one endpoint against the contract and builds its tool,
// or says what is wrong.
func (c *Catalog) endpoint(info micro.Info, ep micro.EndpointInfo) (*Tool, string) {
	tenant, name, problem := c.parseSubject(ep.Subject)
	if problem != "" {
		return nil, problem
	}
	desc := strings.TrimSpace(ep.Metadata[MetaDescription])
	switch {
	case desc == "":
		return nil, fmt.Sprintf("metadata %q is missing: the model needs to know what the tool does", MetaDescription)
	case len(desc) > MaxDescriptionLen:
		return nil, fmt.Sprintf("metadata %q is longer than %d bytes", MetaDescription, MaxDescriptionLen)
	case !utf8.ValidString(desc):
		return nil, fmt.Sprintf("metadata %q is not UTF-8", MetaDescription)
	}
	params, err := schema(ep.Metadata[MetaSchema])
	if err != nil {
		return nil, fmt.Sprintf("metadata %q %v", MetaSchema, err)
	}
	var timeout time.Duration
	if raw, ok := ep.Metadata[MetaTimeout]; ok {
		ms, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err != nil || ms < 1 || time.Duration(ms)*time.Millisecond > MaxTimeout {
			return nil, fmt.Sprintf("metadata %q is %q, not a whole number of milliseconds from 1 to %d", MetaTimeout, raw, MaxTimeout.Milliseconds())
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	return &Tool{
		nc: c.nc, tenant: tenant, name: name, subject: ep.Subject, service: info.Name,
		spec:    model.ToolSpec{Name: Prefix + name, Description: desc, Parameters: params},
		timeout: timeout, defaultTimeout: c.opts.CallTimeout,
	}, ""
}

// parseSubject reads P.tools.<tenant>.<name>.
func (c *Catalog) parseSubject(subject string) (tenant, name, problem string) {
	tokens := strings.Split(subject, ".")
	if len(tokens) == 4 && tokens[1] == "tools" && tokens[0] != c.opts.Names.Prefix {
		return "", "", otherDeployment
	}
	if len(tokens) != 4 || tokens[0] != c.opts.Names.Prefix || tokens[1] != "tools" {
		return "", "", fmt.Sprintf("the subject is not %s", c.opts.Names.ToolSubject("<tenant>", "<name>"))
	}
	tenant, name = tokens[2], tokens[3]
	if !protocol.ValidToken(tenant) {
		// Wildcards included: a tool is served for named tenants only.
		return "", "", fmt.Sprintf("tenant %q is not a tenant id (1 to %d of A-Z a-z 0-9 _ -; no wildcards: serve one endpoint per tenant)", tenant, protocol.MaxTokenLen)
	}
	if !ValidName(name) {
		return "", "", fmt.Sprintf("tool name %q is not 1 to %d of A-Z a-z 0-9 _ -", name, MaxNameLen)
	}
	return tenant, name, ""
}

// schema checks the parameters schema: a JSON object describing an object
// (what model providers accept as function parameters).
func schema(raw string) (json.RawMessage, error) {
	if strings.TrimSpace(raw) == "" {
		return noArguments, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		return nil, fmt.Errorf("is not a JSON object: %v", err)
	}
	var typ string
	if err := json.Unmarshal(obj["type"], &typ); err != nil || typ != "object" {
		return nil, errors.New(`must describe an object: {"type":"object","properties":{...}}`)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(raw)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compareVersions orders semantic versions by major, minor and patch
// (pre-release and build parts are not compared); what does not parse
// sorts first.
func compareVersions(a, b string) int {
	pa, pb := versionParts(a), versionParts(b)
	for i := range pa {
		if pa[i] != pb[i] {
			if pa[i] < pb[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func versionParts(v string) [3]int {
	out := [3]int{-1, -1, -1}
	core, _, _ := strings.Cut(v, "-")
	core, _, _ = strings.Cut(core, "+")
	for i, p := range strings.SplitN(core, ".", 3) {
		n, err := strconv.Atoi(p)
		if err != nil {
			return [3]int{-1, -1, -1}
		}
		out[i] = n
	}
	return out
}

// CheckEntry checks a profile's tools entry that starts with EntryPrefix:
// "remote:<name>", "remote:<prefix>*" or "remote:*".
func CheckEntry(entry string) error {
	rest, ok := strings.CutPrefix(entry, EntryPrefix)
	if !ok {
		return fmt.Errorf("%q is not a remote tool entry: it must start with %q", entry, EntryPrefix)
	}
	if p, wild := strings.CutSuffix(rest, "*"); wild {
		if p == "" || validName.MatchString(p) && len(p) < MaxNameLen {
			return nil
		}
	} else if ValidName(rest) {
		return nil
	}
	return fmt.Errorf("%q is not %s<name> (1 to %d of A-Z a-z 0-9 _ -), %s<prefix>* or %s", entry, EntryPrefix, MaxNameLen, EntryPrefix, Wildcard)
}
