package console

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// loopbackNames are the Host names always allowed: a browser that reaches
// the appliance through a DNS name an attacker controls (DNS rebinding)
// sends that name, and is refused.
var loopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// CheckListen refuses to serve beyond loopback without TLS. addr is a
// host:port; an empty host means every interface, which is not loopback.
func CheckListen(addr string, tls bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if tls || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("%w: %q is not a loopback address (give a certificate and key, or listen on 127.0.0.1)", ErrNoTLS, addr)
}

func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostOnly strips a port and IPv6 brackets and lowercases.
func hostOnly(hostport string) string {
	h := hostport
	if sh, _, err := net.SplitHostPort(hostport); err == nil {
		h = sh
	}
	return strings.ToLower(strings.Trim(h, "[]"))
}

type hostPolicy struct{ allowed map[string]bool }

func newHostPolicy(extra []string) hostPolicy {
	p := hostPolicy{allowed: map[string]bool{}}
	for _, h := range append(append([]string{}, loopbackNames...), extra...) {
		if h = hostOnly(strings.TrimSpace(h)); h != "" {
			p.allowed[h] = true
		}
	}
	return p
}

func (p hostPolicy) host(r *http.Request) bool { return p.allowed[hostOnly(r.Host)] }

// origin accepts a request without an Origin (not a browser) or one from
// an allowed host name.
func (p hostPolicy) origin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return p.allowed[hostOnly(u.Host)]
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// subprotocolPrefix carries the token in Sec-WebSocket-Protocol, for
// clients that would rather not send it as their first message.
const subprotocolPrefix = "outpost.bearer."

func tokenSubprotocol(r *http.Request) (proto, token string) {
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if t, ok := strings.CutPrefix(p, subprotocolPrefix); ok {
				return p, t
			}
		}
	}
	return "", ""
}

// operator names who made a decision: the X-Operator header when given
// (the console sends the name typed at login), else the token's identity.
// A header is bytes: the name is read as UTF-8 (what the console sends),
// and a value that is not UTF-8 as Latin-1, what a browser's fetch sends
// for a string written as is ("Dr M\xfcller"), so that no name is recorded
// garbled.
func operator(r *http.Request) string {
	name := r.Header.Get("X-Operator")
	if !utf8.ValidString(name) {
		runes := make([]rune, len(name))
		for i := 0; i < len(name); i++ {
			runes[i] = rune(name[i])
		}
		name = string(runes)
	}
	name = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f {
			return -1
		}
		return c
	}, strings.TrimSpace(name))
	// At most 64 letters, cut between two of them.
	if runes := []rune(name); len(runes) > 64 {
		name = string(runes[:64])
	}
	if name == "" {
		return "console-token"
	}
	return name + " (console-token)"
}
