package fastproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/valyala/fasthttp"
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
// new --api-key too.
func (s *Server) SetAuth(a Auth) {
	s.setAuth(a)
	s.cfg.Registry.SetAPIKey(a.APIKey)
}

func (s *Server) setAuth(a Auth) {
	s.auth.Store(&authState{client: newClientKeys(a.ClientAPIKeys), admin: newAdminKeys(a.AdminAPIKey, a.AdminAPIKeys)})
	b := ""
	if a.APIKey != "" {
		b = "Bearer " + a.APIKey
	}
	s.bearer.Store(&b)
}

// clientKeys maps the inbound API keys (--client-api-keys) to their
// names, the tenants of the router's queue; the keys are held as SHA-256
// digests: a lookup by digest reveals nothing through its timing about
// keys that share a prefix with the one presented.
type clientKeys map[[sha256.Size]byte]string

// newClientKeys reads key lines: "name:key", or a bare key, named by the
// first 8 hex digits of its SHA-256 ("key-1a2b3c4d").
func newClientKeys(lines []string) clientKeys {
	if len(lines) == 0 {
		return nil
	}
	m := make(clientKeys, len(lines))
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

// admitClient answers 401 and returns false when client keys are configured
// and the request presents none of them; else it returns the name of the
// key presented ("" without client keys). An admitted request loses its
// credentials (dropClientCredentials): they are the client's to the
// router, not to the workers (forward sets --api-key, if any).
func (s *Server) admitClient(ctx *fasthttp.RequestCtx) (string, bool) {
	keys := s.auth.Load().client
	if keys == nil {
		return "", true
	}
	tok := bearerToken(&ctx.Request.Header)
	if tok != nil {
		if name, ok := keys[sha256.Sum256(tok)]; ok {
			dropClientCredentials(&ctx.Request.Header)
			return name, true
		}
	}
	s.metrics.authFailures.Inc()
	unauthorized(ctx, "missing or invalid API key")
	return "", false
}

// clientCredentials are the headers that carry a client's credentials:
// the bearer key of OpenAI's SDKs, the x-api-key of Anthropic's, cookies.
var clientCredentials = []string{fasthttp.HeaderAuthorization, "X-Api-Key", fasthttp.HeaderCookie}

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
