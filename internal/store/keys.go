package store

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Bounds of a namespace and a key.
const (
	MaxLabelBytes = 128
	MaxKeyBytes   = 256
	MaxDepth      = 16
)

// UserPrefixes are the first labels of the namespaces that belong to one
// user: ["users", <user>, ...] and ["memories", <user>, ...] (where the
// memory middleware keeps notes and facts). Only that user reads or
// writes them (the gateway's rule, docs/security.md).
var UserPrefixes = []string{"users", MemoryNamespace}

// MemoryNamespace is the first label of a user's memory items.
const MemoryNamespace = "memories"

// UserScoped returns the user a namespace belongs to: its second label
// when the first is one of UserPrefixes.
func UserScoped(namespace []string) (user string, ok bool) {
	if len(namespace) < 2 {
		return "", false
	}
	for _, p := range UserPrefixes {
		if namespace[0] == p {
			return namespace[1], true
		}
	}
	return "", false
}

// EncodeLabel turns a namespace label or a key into one KV key token,
// reversibly: a label of A-Z, a-z, 0-9, '_' and '-' (at most 128
// characters) stays as it is, anything else becomes '=' followed by its
// base64url encoding without padding ('=' never starts a plain label, so
// the two cannot collide). "users", "alice" and "notes" read as they are
// in the bucket; "a b", "ü" or "x.y" do not break the key's tokens.
func EncodeLabel(label string) string {
	if protocol.ValidToken(label) {
		return label
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(label))
}

// DecodeLabel reverses EncodeLabel.
func DecodeLabel(token string) (string, error) {
	rest, enc := strings.CutPrefix(token, "=")
	if !enc {
		if !protocol.ValidToken(token) {
			return "", fmt.Errorf("key token %q is not a label", token)
		}
		return token, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", fmt.Errorf("key token %q: %w", token, err)
	}
	return string(b), nil
}

// CheckNamespace refuses a namespace LangGraph refuses (an empty label,
// a label with a period) and one beyond the bounds.
func CheckNamespace(namespace []string) error {
	if len(namespace) > MaxDepth {
		return fmt.Errorf("%w: namespace has %d labels, more than %d", ErrInvalid, len(namespace), MaxDepth)
	}
	for _, l := range namespace {
		switch {
		case l == "":
			return fmt.Errorf("%w: namespace labels cannot be empty", ErrInvalid)
		case strings.Contains(l, "."):
			return fmt.Errorf("%w: namespace label %q contains a period; labels cannot contain periods", ErrInvalid, clip(l))
		case len(l) > MaxLabelBytes:
			return fmt.Errorf("%w: namespace label %q is longer than %d bytes", ErrInvalid, clip(l), MaxLabelBytes)
		case !utf8.ValidString(l):
			return fmt.Errorf("%w: namespace label %q is not UTF-8", ErrInvalid, clip(l))
		}
	}
	return nil
}

// CheckKey refuses an empty key and one beyond the bounds.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is required", ErrInvalid)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: key %q is longer than %d bytes", ErrInvalid, clip(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not UTF-8", ErrInvalid, clip(key))
	}
	return nil
}

// ItemKey is the bucket key of an item.
func ItemKey(tenant string, namespace []string, key string) (string, error) {
	if !protocol.ValidToken(tenant) {
		return "", fmt.Errorf("%w: tenant %q is not valid", ErrInvalid, tenant)
	}
	if err := CheckNamespace(namespace); err != nil {
		return "", err
	}
	if err := CheckKey(key); err != nil {
		return "", err
	}
	tokens := make([]string, 0, len(namespace)+2)
	tokens = append(tokens, tenant)
	for _, l := range namespace {
		tokens = append(tokens, EncodeLabel(l))
	}
	return bus.Key(append(tokens, EncodeLabel(key))...), nil
}

// parseKey returns the namespace and key of a bucket key (its tenant
// token dropped).
func parseKey(k string) (namespace []string, key string, err error) {
	tokens := strings.Split(k, ".")
	if len(tokens) < 2 {
		return nil, "", fmt.Errorf("key %q has no item key", k)
	}
	for _, t := range tokens[1 : len(tokens)-1] {
		l, err := DecodeLabel(t)
		if err != nil {
			return nil, "", err
		}
		namespace = append(namespace, l)
	}
	key, err = DecodeLabel(tokens[len(tokens)-1])
	return namespace, key, err
}

func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	i := 64
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}
