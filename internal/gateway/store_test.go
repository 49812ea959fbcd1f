package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/memory"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

const carolKey = "carol-0123456789-secret-key"

// newStoreEnv is a gateway with keys for alice and bob (tenant acme) and
// carol (tenant other), its store ranking queries with the test server's
// embeddings when semantic.
func newStoreEnv(t *testing.T, semantic bool) *env {
	t.Helper()
	return newEnvWith(t, nil, func(s *Server) {
		a, err := newAuthenticator([]APIKey{
			{Name: "alice", Tenant: "acme", SHA256: sha256.Sum256([]byte(aliceKey))},
			{Name: "bob", Tenant: "acme", SHA256: sha256.Sum256([]byte(bobKey))},
			{Name: "carol", Tenant: "other", SHA256: sha256.Sum256([]byte(carolKey))},
		})
		if err != nil {
			t.Fatal(err)
		}
		s.auth = a
		if semantic {
			srv := openaitest.NewServer(t, nil)
			emb, err := model.NewOpenAIEmbeddings(model.EmbeddingsConfig{BaseURL: srv.URL(), Model: "embed"})
			if err != nil {
				t.Fatal(err)
			}
			s.cfg.Embedder = emb
		}
		if err := s.openStore(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// nullBody reports whether r's body is JSON null (a missing item).
func nullBody(r response) bool { return strings.TrimSpace(string(r.body)) == "null" }

func as(key string) []string { return []string{"X-Api-Key", key} }

func getItemPath(ns, key string) string {
	return "/store/items?" + url.Values{"namespace": {ns}, "key": {key}}.Encode()
}

type storeItem struct {
	Namespace []string       `json:"namespace"`
	Key       string         `json:"key"`
	Value     map[string]any `json:"value"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
	Score     *float64       `json:"score"`
}

func searchKeys(t *testing.T, r response) []string {
	t.Helper()
	var out struct {
		Items []storeItem `json:"items"`
	}
	r.decode(t, &out)
	keys := []string{}
	for _, it := range out.Items {
		keys = append(keys, it.Key)
	}
	return keys
}

func TestStoreRoutes(t *testing.T) {
	e := newStoreEnv(t, false)
	put := func(key string, body map[string]any) response {
		return e.do(http.MethodPut, "/store/items", body, as(key)...)
	}
	put(aliceKey, map[string]any{"namespace": []string{"team", "docs"}, "key": "a", "value": map[string]any{"title": "Alpha plan", "n": 1}}).expect(t, http.StatusNoContent)
	put(bobKey, map[string]any{"namespace": []string{"team", "docs"}, "key": "b", "value": map[string]any{"title": "Beta plan", "n": 2}}).expect(t, http.StatusNoContent)

	// A tenant's store is shared by its principals.
	var it storeItem
	e.do(http.MethodGet, getItemPath("team.docs", "a"), nil, as(bobKey)...).expect(t, http.StatusOK).decode(t, &it)
	if it.Key != "a" || !slices.Equal(it.Namespace, []string{"team", "docs"}) || it.Value["title"] != "Alpha plan" || it.CreatedAt.IsZero() || it.UpdatedAt.IsZero() {
		t.Fatalf("item %+v", it)
	}
	// A missing item is null, as LangGraph answers.
	if r := e.do(http.MethodGet, getItemPath("team.docs", "zzz"), nil, as(aliceKey)...).expect(t, http.StatusOK); !nullBody(r) {
		t.Fatalf("missing item: %s", r.body)
	}
	// Search: prefix, filter, substring query, paging.
	s := e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"team"}}, as(aliceKey)...).expect(t, http.StatusOK)
	if got := searchKeys(t, s); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("search %v", got)
	}
	if got := searchKeys(t, e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"team"}, "filter": map[string]any{"n": 1}}, as(aliceKey)...)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("filter %v", got)
	}
	if got := searchKeys(t, e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{}, "query": "beta"}, as(aliceKey)...)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("query %v", got)
	}
	if got := searchKeys(t, e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"team"}, "limit": 1, "offset": 1}, as(aliceKey)...)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("page %v", got)
	}
	// Namespaces.
	var nss struct {
		Namespaces [][]string `json:"namespaces"`
	}
	e.do(http.MethodPost, "/store/namespaces", map[string]any{"prefix": []string{"team"}, "max_depth": 1}, as(aliceKey)...).expect(t, http.StatusOK).decode(t, &nss)
	if len(nss.Namespaces) != 1 || !slices.Equal(nss.Namespaces[0], []string{"team"}) {
		t.Fatalf("namespaces %v", nss.Namespaces)
	}
	// Another tenant sees none of it and cannot delete it.
	if r := e.do(http.MethodGet, getItemPath("team.docs", "a"), nil, as(carolKey)...).expect(t, http.StatusOK); !nullBody(r) {
		t.Fatalf("another tenant read the item: %s", r.body)
	}
	if got := searchKeys(t, e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{}}, as(carolKey)...)); len(got) != 0 {
		t.Fatalf("another tenant found %v", got)
	}
	e.do(http.MethodPost, "/store/namespaces", map[string]any{}, as(carolKey)...).expect(t, http.StatusOK).decode(t, &nss)
	if len(nss.Namespaces) != 0 {
		t.Fatalf("another tenant listed %v", nss.Namespaces)
	}
	e.do(http.MethodDelete, "/store/items", map[string]any{"namespace": []string{"team", "docs"}, "key": "a"}, as(carolKey)...).expect(t, http.StatusNoContent)
	e.do(http.MethodGet, getItemPath("team.docs", "a"), nil, as(aliceKey)...).expect(t, http.StatusOK).decode(t, &it)
	if it.Key != "a" {
		t.Fatal("another tenant's delete removed the item")
	}
	// Delete.
	e.do(http.MethodDelete, "/store/items", map[string]any{"namespace": []string{"team", "docs"}, "key": "a"}, as(bobKey)...).expect(t, http.StatusNoContent)
	if r := e.do(http.MethodGet, getItemPath("team.docs", "a"), nil, as(aliceKey)...); !nullBody(r) {
		t.Fatalf("deleted item: %s", r.body)
	}
	// Invalid input is 400 naming the field.
	for _, c := range []struct {
		method, path string
		body         any
		field        string
	}{
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{"a.b"}, "key": "k", "value": map[string]any{}}, "namespace"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{""}, "key": "k", "value": map[string]any{}}, "namespace"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{}, "key": "k", "value": map[string]any{}}, "namespace"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{"a"}, "key": "", "value": map[string]any{}}, "key"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k"}, "value"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": map[string]any{}, "ttl": -1}, "ttl"},
		{http.MethodPut, "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": map[string]any{}, "index": true}, "index"},
		{http.MethodGet, getItemPath("a", ""), nil, "key"},
		{http.MethodGet, getItemPath("", "k"), nil, "namespace"},
		{http.MethodPost, "/store/items/search", map[string]any{"filter": map[string]any{"n": map[string]any{"$regex": "x"}}}, "filter"},
		{http.MethodPost, "/store/items/search", map[string]any{"limit": 0}, "limit"},
		{http.MethodPost, "/store/namespaces", map[string]any{"max_depth": 0}, "max_depth"},
	} {
		r := e.do(c.method, c.path, c.body, as(aliceKey)...)
		if r.status != http.StatusBadRequest || r.apiError(t).Field != c.field {
			t.Errorf("%s %s %v: %d %s, want 400 on %s", c.method, c.path, c.body, r.status, r.body, c.field)
		}
	}
}

func TestStoreUserNamespaces(t *testing.T) {
	e := newStoreEnv(t, false)
	for _, ns := range [][]string{{"users", "alice", "prefs"}, {"memories", "alice"}} {
		e.do(http.MethodPut, "/store/items", map[string]any{"namespace": ns, "key": "k", "value": map[string]any{"secret": "alice's"}}, as(aliceKey)...).expect(t, http.StatusNoContent)
	}
	e.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"users", "bob"}, "key": "k", "value": map[string]any{"secret": "bob's"}}, as(bobKey)...).expect(t, http.StatusNoContent)
	// Bob may neither read, write, delete nor search alice's namespaces.
	for _, r := range []response{
		e.do(http.MethodGet, getItemPath("users.alice.prefs", "k"), nil, as(bobKey)...),
		e.do(http.MethodGet, getItemPath("memories.alice", "k"), nil, as(bobKey)...),
		e.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"users", "alice"}, "key": "x", "value": map[string]any{}}, as(bobKey)...),
		e.do(http.MethodDelete, "/store/items", map[string]any{"namespace": []string{"users", "alice", "prefs"}, "key": "k"}, as(bobKey)...),
		e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"users", "alice"}}, as(bobKey)...),
		e.do(http.MethodPost, "/store/namespaces", map[string]any{"prefix": []string{"memories", "alice"}}, as(bobKey)...),
	} {
		if r.status != http.StatusForbidden {
			t.Errorf("bob on alice's namespace: %d %s", r.status, r.body)
		}
	}
	// A wider search or listing leaves alice's namespaces out for bob.
	if got := searchKeys(t, e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{}}, as(bobKey)...)); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("bob's search: %v", got)
	}
	var s struct {
		Items []storeItem `json:"items"`
	}
	e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"users"}}, as(bobKey)...).decode(t, &s)
	if len(s.Items) != 1 || s.Items[0].Value["secret"] != "bob's" {
		t.Fatalf("bob's search under users: %+v", s.Items)
	}
	var nss struct {
		Namespaces [][]string `json:"namespaces"`
	}
	e.do(http.MethodPost, "/store/namespaces", map[string]any{}, as(bobKey)...).expect(t, http.StatusOK).decode(t, &nss)
	if len(nss.Namespaces) != 1 || !slices.Equal(nss.Namespaces[0], []string{"users", "bob"}) {
		t.Fatalf("bob's namespaces: %v", nss.Namespaces)
	}
	// Alice reads her own; alice's item is intact.
	var it storeItem
	e.do(http.MethodGet, getItemPath("users.alice.prefs", "k"), nil, as(aliceKey)...).expect(t, http.StatusOK).decode(t, &it)
	if it.Value["secret"] != "alice's" {
		t.Fatalf("alice's item: %+v", it)
	}
	e.do(http.MethodPost, "/store/namespaces", map[string]any{}, as(aliceKey)...).expect(t, http.StatusOK).decode(t, &nss)
	if len(nss.Namespaces) != 2 {
		t.Fatalf("alice's namespaces: %v", nss.Namespaces)
	}
	// Carol of another tenant, same user-scoped path: nothing.
	if r := e.do(http.MethodGet, getItemPath("users.alice.prefs", "k"), nil, as(carolKey)...); r.status != http.StatusForbidden {
		t.Fatalf("carol on users.alice: %d %s", r.status, r.body)
	}
	// On an open gateway (no principal) the tenant's namespaces are shared.
	open := newEnv(t, nil)
	open.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"users", "x"}, "key": "k", "value": map[string]any{}}, "X-Tenant", "t1").expect(t, http.StatusNoContent)
	open.do(http.MethodGet, getItemPath("users.x", "k"), nil, "X-Tenant", "t1").expect(t, http.StatusOK)
	if r := open.do(http.MethodGet, getItemPath("users.x", "k"), nil, "X-Tenant", "t2"); !nullBody(r) {
		t.Fatalf("open gateway, another tenant: %s", r.body)
	}
}

func TestStoreTTL(t *testing.T) {
	e := newStoreEnv(t, false)
	// 0.05 minutes: 3 seconds.
	e.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"cache"}, "key": "gone", "value": map[string]any{"v": 1}, "ttl": 0.05}, as(aliceKey)...).expect(t, http.StatusNoContent)
	e.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"cache"}, "key": "kept", "value": map[string]any{"v": 2}, "ttl": 0.05}, as(aliceKey)...).expect(t, http.StatusNoContent)
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Reading "kept" refreshes its TTL (the default); "gone" is read
		// without refreshing.
		if r := e.do(http.MethodGet, getItemPath("cache", "kept"), nil, as(aliceKey)...); nullBody(r) {
			t.Fatal("an item read every half second expired")
		}
		if r := e.do(http.MethodGet, getItemPath("cache", "gone")+"&refresh_ttl=false", nil, as(aliceKey)...); nullBody(r) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the item never expired")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func TestStoreSemanticSearch(t *testing.T) {
	e := newStoreEnv(t, true)
	for key, text := range map[string]string{"pets": "two cats and a dog", "food": "spicy food and pizza", "job": "works nights as a nurse"} {
		e.do(http.MethodPut, "/store/items", map[string]any{"namespace": []string{"users", "alice", "facts"}, "key": key, "value": map[string]any{"text": text}, "index": []string{"text"}}, as(aliceKey)...).expect(t, http.StatusNoContent)
	}
	var s struct {
		Items []storeItem `json:"items"`
	}
	e.do(http.MethodPost, "/store/items/search", map[string]any{"namespace_prefix": []string{"users", "alice"}, "query": "does she like pizza", "limit": 2}, as(aliceKey)...).expect(t, http.StatusOK).decode(t, &s)
	if len(s.Items) != 2 || s.Items[0].Key != "food" || s.Items[0].Score == nil || *s.Items[0].Score <= *s.Items[1].Score {
		raw, _ := json.Marshal(s.Items)
		t.Fatalf("ranking: %s", raw)
	}
}

// TestLangGraphSDKStore runs the official SDK's store client against the
// gateway (testdata/langgraph-sdk/store.mjs), and checks that the memory
// notes alice edited through it are what the memory middleware reads.
func TestLangGraphSDKStore(t *testing.T) {
	e := newStoreEnv(t, true)
	mem, err := memory.Open(t.Context(), e.js, memory.Config{Names: e.settings.Names})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.AppendNote(t.Context(), "acme", "alice", "Lives in Lyon"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ALICE_KEY", aliceKey)
	t.Setenv("BOB_KEY", bobKey)
	t.Setenv("CAROL_KEY", carolKey)
	runSDKScript(t, e, "store.mjs", 8)
	if notes, err := mem.Notes(t.Context(), "acme", "alice"); err != nil || notes != "- Lives in Paris" {
		t.Fatalf("alice's notes after her edit through the SDK: %q %v", notes, err)
	}
}
