package fastproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/tenantlimit"
)

// adminAccess is how a listener admits admin surfaces (docs/design.md §8).
type adminAccess uint8

const (
	adminKeyOnly adminAccess = iota // the admin key as a bearer token; absent key: the surfaces do not exist (404)
	adminOpen                       // a loopback-bound listener: whoever can reach it is on the machine
)

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header, or nil. It aliases the request header.
func bearerToken(h *fasthttp.RequestHeader) []byte {
	a := h.Peek(fasthttp.HeaderAuthorization)
	const prefix = "bearer "
	if len(a) <= len(prefix) || !bytes.EqualFold(a[:len(prefix)], []byte(prefix)) {
		return nil
	}
	return bytes.TrimSpace(a[len(prefix):])
}

// admitAdmin answers the request itself and returns false unless it may use
// an admin surface: with access adminKeyOnly, no configured key means 404
// (the surface is not there) and a missing or wrong key 401. It returns
// who called: the name of the admin key presented, or "loopback" (the
// audit log's who). Keys are looked up by SHA-256 digest, as client keys.
func (s *Server) admitAdmin(ctx *fasthttp.RequestCtx, access adminAccess) (string, bool) {
	if access == adminOpen {
		return whoLoopback, true
	}
	keys := s.auth.Load().admin
	if len(keys) == 0 {
		noRoute(ctx)
		return "", false
	}
	if tok := bearerToken(&ctx.Request.Header); tok != nil {
		if name, ok := keys[sha256.Sum256(tok)]; ok {
			return name, true
		}
	}
	s.metrics.authFailures.Inc()
	unauthorized(ctx, "admin surface: present the router's admin key as a bearer token")
	return "", false
}

// whoLoopback names, in the audit log, a caller of a loopback metrics
// listener: it presents no key.
const whoLoopback = "loopback"

// adminKeys maps the admin keys' SHA-256 digests to their names.
type adminKeys map[[sha256.Size]byte]string

// newAdminKeys is the table of --admin-api-key (named "admin") and the
// lines of --admin-api-keys-file: "name:key", or a bare key named like a
// bare client key.
func newAdminKeys(single string, lines []string) adminKeys {
	m := adminKeys{}
	if single != "" {
		m[sha256.Sum256([]byte(single))] = "admin"
	}
	for _, l := range lines {
		name, key, named := strings.Cut(l, ":")
		if !named || name == "" || key == "" {
			name, key = "", l
		}
		sum := sha256.Sum256([]byte(key))
		if name == "" {
			name = "key-" + hex.EncodeToString(sum[:4])
		}
		m[sum] = name
	}
	return m
}

// authState is what admits callers and what the router presents to the
// workers, swapped whole on a reload (SetAuth): a request sees one table.
type authState struct {
	client clientKeys
	admin  adminKeys
}

// Auth is the server's credentials (Config's fields of the same names),
// as SetAuth replaces them.
type Auth struct {
	ClientAPIKeys []string // key lines (--client-api-keys); none: inference is open
	AdminAPIKey   string   // --admin-api-key, named "admin"
	AdminAPIKeys  []string // name:key lines (--admin-api-keys-file)
	APIKey        string   // --api-key: the bearer token sent to workers
}

// SetAuth replaces the client keys, the admin keys and the key sent to the
// workers (a reload, docs/design.md §8, "Reload and audit"): requests
// admitted after it are checked against the new keys; a request in flight
// keeps what admitted it. The registry's own calls to the workers take the
// new --api-key too. Client key lines that do not parse
// (CheckClientKeys) change nothing.
func (s *Server) SetAuth(a Auth) error {
	if err := s.setAuth(a); err != nil {
		return err
	}
	s.cfg.Registry.SetAPIKey(a.APIKey)
	return nil
}

func (s *Server) setAuth(a Auth) error {
	client, err := parseClientKeys(a.ClientAPIKeys)
	if err != nil {
		return fmt.Errorf("client API keys: %w", err)
	}
	s.auth.Store(&authState{client: client, admin: newAdminKeys(a.AdminAPIKey, a.AdminAPIKeys)})
	b := ""
	if a.APIKey != "" {
		b = "Bearer " + a.APIKey
	}
	s.bearer.Store(&b)
	return nil
}

// CheckClientKeys reports whether the lines of a --client-api-keys file
// parse (parseClientKeys): a reload checks them before it changes anything.
func CheckClientKeys(lines []string) error {
	_, err := parseClientKeys(lines)
	return err
}

// clientKeys maps the inbound API keys (--client-api-keys) to their
// tenants: the names of the router's queue, with their limits
// (docs/design.md §8, "Tenant limits"). The keys are held as SHA-256 digests: a lookup by
// digest reveals nothing through its timing about keys that share a prefix
// with the one presented. A key table is built whole by parseClientKeys
// and only read after.
type clientKeys map[[sha256.Size]byte]*tenant

// tenant is the owner of one or more client keys.
type tenant struct {
	name   string
	limits tenantlimit.Limits
}

// maxTenantName bounds a key's name: it is a metric label and a log field.
const maxTenantName = 128

// parseClientKeys reads the lines of a --client-api-keys file (blank
// lines and lines starting with '#' are skipped). A line is a key, then
// optional limits, separated by spaces or tabs:
//
//	name:key [rpm=N] [tpm=N]
//	key [rpm=N] [tpm=N]
//
// A bare key is named by the first 8 hex digits of its SHA-256
// ("key-1a2b3c4d"); a line whose part before its first ':' or after it is
// empty is a bare key. rpm is requests per minute, tpm tokens (prompt and
// completion) per minute; absent, that limit is off. The lines of one name
// must give it the same limits. An error names the line by its number and
// never quotes a key. No lines: nil, no keys.
func parseClientKeys(lines []string) (clientKeys, error) {
	if len(lines) == 0 {
		return nil, nil
	}
	m := make(clientKeys, len(lines))
	byName := map[string]*tenant{}
	lineOf := map[string]int{}             // a name's first line
	keyLine := map[[sha256.Size]byte]int{} // a key's line
	for i, l := range lines {
		n := i + 1
		fields := strings.Fields(l)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		name, key, named := strings.Cut(fields[0], ":")
		if !named || name == "" || key == "" {
			name, key = "", fields[0]
		}
		var lim tenantlimit.Limits
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			var dst *int64
			switch k {
			case "rpm":
				dst = &lim.RPM
			case "tpm":
				dst = &lim.TPM
			}
			if !ok || dst == nil {
				return nil, fmt.Errorf("line %d: after the key, want rpm=N or tpm=N", n)
			}
			if *dst != 0 {
				return nil, fmt.Errorf("line %d: %s given twice", n, k)
			}
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil || x <= 0 || x > 1e15 {
				return nil, fmt.Errorf("line %d: %s wants a whole number from 1 to 10^15", n, k)
			}
			*dst = x
		}
		sum := sha256.Sum256([]byte(key))
		if name == "" {
			name = "key-" + hex.EncodeToString(sum[:4])
		} else if !validTenantName(name) {
			return nil, fmt.Errorf("line %d: a key's name is at most %d printable characters without quotes or backslashes", n, maxTenantName)
		}
		if _, dup := m[sum]; dup {
			return nil, fmt.Errorf("line %d: the same key as line %d", n, keyLine[sum])
		}
		t := byName[name]
		switch {
		case t == nil:
			t = &tenant{name: name, limits: lim}
			byName[name] = t
			lineOf[name] = n
		case t.limits != lim:
			return nil, fmt.Errorf("line %d: %s has other limits on line %d", n, name, lineOf[name])
		}
		m[sum] = t
		keyLine[sum] = n
	}
	if len(m) == 0 {
		return nil, errors.New("no keys")
	}
	return m, nil
}

// validTenantName: printable ASCII, no quote or backslash (a metric label
// as it is), at most maxTenantName bytes.
func validTenantName(s string) bool {
	if len(s) > maxTenantName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// hdrXAPIKey is where Anthropic's SDKs send their key.
const hdrXAPIKey = "X-Api-Key"

// admitClient answers 401 and returns false when client keys are configured
// and the request presents none of them; else it returns the key's tenant
// (nil without client keys). The key is read from "Authorization: Bearer",
// or, where that is absent, from x-api-key (Anthropic's SDKs). An admitted
// request loses its credentials (dropClientCredentials): they are the
// client's to the router, not to the workers (forward sets --api-key, if
// any).
func (s *Server) admitClient(ctx *fasthttp.RequestCtx) (*tenant, bool) {
	keys := s.auth.Load().client
	if keys == nil {
		return nil, true
	}
	h := &ctx.Request.Header
	tok := bearerToken(h)
	if tok == nil && len(h.Peek(fasthttp.HeaderAuthorization)) == 0 {
		tok = h.Peek(hdrXAPIKey)
	}
	if len(tok) > 0 {
		if t, ok := keys[sha256.Sum256(tok)]; ok {
			dropClientCredentials(h)
			return t, true
		}
	}
	s.metrics.authFailures.Inc()
	unauthorized(ctx, "missing or invalid API key")
	return nil, false
}

// clientCredentials are the headers that carry a client's credentials:
// the bearer key of OpenAI's SDKs, the x-api-key of Anthropic's, cookies.
var clientCredentials = []string{fasthttp.HeaderAuthorization, hdrXAPIKey, fasthttp.HeaderCookie}

// dropClientCredentials removes the client's credentials from a request
// the router authenticated: no worker sees them.
func dropClientCredentials(h *fasthttp.RequestHeader) {
	for _, k := range clientCredentials {
		h.Del(k)
	}
}

func unauthorized(ctx *fasthttp.RequestCtx, msg string) {
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="warmroute"`)
	writeError(ctx, fasthttp.StatusUnauthorized, "authentication_error", "invalid_api_key", msg)
}
