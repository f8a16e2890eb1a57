package fastproxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
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
// (the surface is not there) and a missing or wrong key 401. The key is
// compared in constant time.
func (s *Server) admitAdmin(ctx *fasthttp.RequestCtx, access adminAccess) bool {
	if access == adminOpen {
		return true
	}
	if len(s.adminKey) == 0 {
		noRoute(ctx)
		return false
	}
	if tok := bearerToken(&ctx.Request.Header); tok != nil && subtle.ConstantTimeCompare(tok, s.adminKey) == 1 {
		return true
	}
	s.metrics.authFailures.Inc()
	unauthorized(ctx, "admin surface: present the router's admin key as a bearer token")
	return false
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
	if s.clientKeys == nil {
		return "", true
	}
	tok := bearerToken(&ctx.Request.Header)
	if tok != nil {
		if name, ok := s.clientKeys[sha256.Sum256(tok)]; ok {
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
