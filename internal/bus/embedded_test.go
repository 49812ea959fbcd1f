package bus

import (
	"net"
	"net/url"
	"testing"
)

// Listen "host:0" takes any free port, as net.Listen does, not the
// server's default 4222 (which another process, or test, may hold).
func TestEmbeddedListenOnAnyPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:4222")
	if err == nil {
		defer func() { _ = held.Close() }()
	}
	e, err := StartEmbedded(EmbeddedConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	u, err := url.Parse(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	if p := u.Port(); p == "" || p == "0" || p == "4222" {
		t.Fatalf("client URL %s: want a free port of the system's choice", e.ClientURL())
	}
}
