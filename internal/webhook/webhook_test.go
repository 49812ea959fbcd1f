package webhook

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"testing"
)

func TestAddressRules(t *testing.T) {
	for addr, public := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700:4700::1111": true,
		"127.0.0.1": false, "127.8.9.1": false, "::1": false, "10.0.0.1": false, "172.16.5.4": false,
		"192.168.1.1": false, "169.254.169.254": false, "fe80::1": false, "fd00::1": false, "0.0.0.0": false,
		"::": false, "100.64.0.1": false, "::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false,
		"64:ff9b::a00:1": false, "2002:a00:1::": false, "224.0.0.1": false, "255.255.255.255": false,
	} {
		err := checkAddr(netip.MustParseAddr(addr))
		if (err == nil) != public {
			t.Errorf("%s: err %v, want public=%v", addr, err, public)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v is not ErrRefused", addr, err)
		}
	}
}

func TestURLRules(t *testing.T) {
	for raw, ok := range map[string]bool{
		"https://example.com/hook": true, "http://example.com:8080/x?y=1": true,
		"ftp://example.com/": false, "https://user:pw@example.com/": false, "https:///x": false,
		"javascript:alert(1)": false, "/relative": false,
	} {
		if _, err := CheckURL(raw); (err == nil) != ok {
			t.Errorf("%s: err %v, want ok=%v", raw, err, ok)
		}
	}
	// A name that resolves to loopback is refused; allowed when private
	// addresses are.
	u, _ := url.Parse("http://localhost:1/x")
	if err := CheckHost(context.Background(), u, false); !errors.Is(err, ErrRefused) {
		t.Errorf("localhost: %v", err)
	}
	if err := CheckHost(context.Background(), u, true); err != nil {
		t.Errorf("localhost with allow_private: %v", err)
	}
}

// The signature is HMAC-SHA256 of the body, hex, prefixed.
func TestSign(t *testing.T) {
	// echo -n '{"a":1}' | openssl dgst -sha256 -hmac key
	if got := Sign("key", []byte(`{"a":1}`)); got != "sha256=88a67f24bbcdaed0e6c997404bb79a743baf44c6bab2f4c27328e3009d22e342" {
		t.Fatalf("signature %q", got)
	}
	if Sign("key", []byte("a")) == Sign("other", []byte("a")) || Sign("key", []byte("a")) == Sign("key", []byte("b")) {
		t.Fatal("signature ignores the secret or the body")
	}
}
