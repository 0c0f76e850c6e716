package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/policy"
)

// ErrHostNotAllowed is wrapped when an http tool's URL names a host outside
// its allowlist, and ErrRedirect when the server answers with a redirect.
var (
	ErrHostNotAllowed = errors.New("host not in the http tool's allowlist")
	ErrRedirect       = errors.New("http tool does not follow redirects")
)

// DefaultHTTPMaxBytes caps an http tool's response body.
const DefaultHTTPMaxBytes = 64 << 10

// HTTPSpec declares an http tool for an on-site system, as a bundle writes
// it. URL and header values are templates: {{name}} is replaced by the
// argument name, URL-escaped in the URL (every byte outside A-Z a-z 0-9 - .
// _ ~ is percent-encoded, so an argument can never add a path segment, a
// query parameter or a fragment). Placeholders may not appear in the URL's
// scheme or host: the host is fixed by the bundle and must be in Hosts.
type HTTPSpec struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Kind        policy.Kind       `json:"kind"`
	Idempotent  bool              `json:"idempotent"`
	Method      string            `json:"method"`
	URL         string            `json:"url"`
	Headers     map[string]string `json:"headers,omitempty"`
	// Hosts is the allowlist: "host" (any port) or "host:port".
	Hosts []string `json:"hosts"`
	// Schema of the arguments; when empty, every placeholder is a required
	// string and nothing else is accepted.
	Schema   json.RawMessage `json:"schema,omitempty"`
	MaxBytes int64           `json:"max_bytes,omitempty"`
	Timeout  time.Duration   `json:"timeout,omitempty"`
}

// HTTPTool is a declared http tool. Requests other than GET and HEAD send
// the arguments as a JSON body.
type HTTPTool struct {
	spec   HTTPSpec
	params []string
	client *http.Client
}

var placeholderRE = regexp.MustCompile(`\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}`)

// NewHTTPTool validates spec. client may be nil (a fresh one is used); its
// redirect policy is replaced so that no redirect is ever followed.
func NewHTTPTool(spec HTTPSpec, client *http.Client) (*HTTPTool, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: http tool %q: %s", policy.ErrBadRule, spec.Name, fmt.Sprintf(format, args...))
	}
	spec.Method = strings.ToUpper(spec.Method)
	switch spec.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return nil, bad("method %q is not supported", spec.Method)
	}
	if spec.Kind == "" {
		return nil, bad("kind is required (read or write)")
	}
	if len(spec.Hosts) == 0 {
		return nil, bad("no allowed hosts")
	}
	i := strings.Index(spec.URL, "://")
	if i < 0 {
		return nil, bad("url %q has no scheme", spec.URL)
	}
	authorityEnd := len(spec.URL)
	if j := strings.IndexAny(spec.URL[i+3:], "/?#"); j >= 0 {
		authorityEnd = i + 3 + j
	}
	if strings.Contains(spec.URL[:authorityEnd], "{{") {
		return nil, bad("placeholders may not appear in the scheme or host of %q", spec.URL)
	}
	u, err := url.Parse(placeholderRE.ReplaceAllString(spec.URL, "x"))
	if err != nil {
		return nil, bad("url: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, bad("url scheme must be http or https")
	}
	if u.User != nil {
		return nil, bad("url may not carry credentials")
	}
	if !hostAllowed(spec.Hosts, u) {
		return nil, bad("url host %q is not in its own allowlist", u.Host)
	}
	seen := map[string]bool{}
	var params []string
	collect := func(s string) error {
		if strings.Count(s, "{{") != len(placeholderRE.FindAllString(s, -1)) {
			return bad("malformed placeholder in %q", s)
		}
		for _, m := range placeholderRE.FindAllStringSubmatch(s, -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				params = append(params, m[1])
			}
		}
		return nil
	}
	if err := collect(spec.URL); err != nil {
		return nil, err
	}
	for k, v := range spec.Headers {
		if err := collect(v); err != nil {
			return nil, err
		}
		if strings.ContainsAny(k+v, "\r\n") {
			return nil, bad("header %q contains a line break", k)
		}
	}
	sort.Strings(params)
	if len(spec.Schema) == 0 {
		props := map[string]any{}
		for _, p := range params {
			props[p] = map[string]any{"type": "string", "maxLength": 1000}
		}
		spec.Schema, _ = json.Marshal(map[string]any{"type": "object", "properties": props,
			"required": append([]string{}, params...), "additionalProperties": false})
	}
	if _, err := policy.NewRegistry([]policy.Tool{httpDef(spec)}); err != nil {
		return nil, err
	}
	if spec.MaxBytes <= 0 {
		spec.MaxBytes = DefaultHTTPMaxBytes
	}
	var c http.Client
	if client != nil {
		c = *client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if spec.Timeout > 0 {
		c.Timeout = spec.Timeout
	}
	return &HTTPTool{spec: spec, params: params, client: &c}, nil
}

func httpDef(spec HTTPSpec) policy.Tool {
	return policy.Tool{Name: spec.Name, Description: spec.Description, Kind: spec.Kind,
		Idempotent: spec.Idempotent, Schema: spec.Schema}
}

// Def is the tool's registry entry.
func (h *HTTPTool) Def() policy.Tool { return httpDef(h.spec) }

func hostAllowed(hosts []string, u *url.URL) bool {
	for _, h := range hosts {
		h = strings.ToLower(h)
		if h == strings.ToLower(u.Host) {
			return true
		}
		if _, _, err := net.SplitHostPort(h); err != nil && h == strings.ToLower(u.Hostname()) {
			return true
		}
	}
	return false
}

// strictEscape percent-encodes every byte but the unreserved characters of
// RFC 3986.
func strictEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func fill(tmpl string, vals map[string]string, escape func(string) string) string {
	return placeholderRE.ReplaceAllStringFunc(tmpl, func(m string) string {
		return escape(vals[m[2:len(m)-2]])
	})
}

// Call implements Tool: it sends the request and returns {"status",
// "body", "truncated"?}; the body is JSON when the server sent JSON, else
// text.
func (h *HTTPTool) Call(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error) {
	var raw map[string]any
	if err := json.Unmarshal(normalizeArgs(args), &raw); err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	vals := map[string]string{}
	for _, p := range h.params {
		v, ok := raw[p]
		switch x := v.(type) {
		case string:
			vals[p] = x
		case float64:
			vals[p] = strconv.FormatFloat(x, 'f', -1, 64)
		case bool:
			vals[p] = strconv.FormatBool(x)
		default:
			if !ok {
				return nil, fmt.Errorf("argument %q is missing", p)
			}
			return nil, fmt.Errorf("argument %q must be a string, number or boolean", p)
		}
	}
	target := fill(h.spec.URL, vals, strictEscape)
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || !hostAllowed(h.spec.Hosts, u) {
		return nil, fmt.Errorf("%w: %s", ErrHostNotAllowed, u.Host)
	}
	var body io.Reader
	if h.spec.Method != http.MethodGet && h.spec.Method != http.MethodHead {
		body = bytes.NewReader(normalizeArgs(args))
	}
	req, err := http.NewRequestWithContext(ctx, h.spec.Method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range h.spec.Headers {
		v = fill(v, vals, func(s string) string { return s })
		if strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("header %q: argument contains a line break", k)
		}
		req.Header.Set(k, v)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", h.spec.Method, u.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return nil, fmt.Errorf("%w: %s answered %d (to %q)", ErrRedirect, u.Host, resp.StatusCode, resp.Header.Get("Location"))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, h.spec.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", h.spec.Method, u.Redacted(), err)
	}
	out := map[string]any{"status": resp.StatusCode}
	if int64(len(data)) > h.spec.MaxBytes {
		data = data[:h.spec.MaxBytes]
		out["truncated"] = true
	}
	if json.Valid(data) && len(data) > 0 {
		out["body"] = json.RawMessage(data)
	} else {
		out["body"] = string(data)
	}
	return json.Marshal(out)
}
