package loadview

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrNotAllowed is returned (wrapped) by Admit for a worker URL that the
// admin API may not register.
var ErrNotAllowed = errors.New("worker url not allowed")

// ErrTooManyWorkers is returned (wrapped) by Add when the registry would
// hold more than Config.MaxWorkers workers.
var ErrTooManyWorkers = errors.New("too many workers")

// allowList is the parsed Config.AllowedWorkers.
type allowList struct {
	any   bool                // the list is empty: every well-formed URL is allowed
	hosts map[string]struct{} // lower-case hostnames, matched exactly
	nets  []netip.Prefix      // matched against IP-literal hosts only
}

func newAllowList(entries []string) (allowList, []error) {
	a := allowList{any: len(entries) == 0, hosts: map[string]struct{}{}}
	var errs []error
	for _, e := range entries {
		host, pfx, isNet, err := parseAllowEntry(e)
		switch {
		case err != nil:
			errs = append(errs, err) // skipped: a bad entry allows nothing (fail closed)
		case isNet:
			a.nets = append(a.nets, pfx)
		default:
			a.hosts[host] = struct{}{}
		}
	}
	return a, errs
}

// ParseAllowList splits a flag value such as
// "gpu-1.internal, 10.0.0.0/8 fd00::/8" (commas and/or spaces) into allow-list
// entries for Config.AllowedWorkers, normalised (hostnames lower-cased,
// CIDRs masked, a bare IP as a one-address CIDR), and reports the first
// invalid entry. An empty value gives an empty list (allow any worker).
func ParseAllowList(s string) ([]string, error) {
	var out []string
	for _, e := range strings.FieldsFunc(s, func(c rune) bool { return c == ',' || c == ' ' || c == '\t' || c == '\n' }) {
		host, pfx, isNet, err := parseAllowEntry(e)
		if err != nil {
			return nil, err
		}
		if isNet {
			out = append(out, pfx.String())
		} else {
			out = append(out, host)
		}
	}
	return out, nil
}

// parseAllowEntry reads one entry: a CIDR, an IP address (a one-address
// CIDR), or a hostname without port.
func parseAllowEntry(e string) (host string, pfx netip.Prefix, isNet bool, err error) {
	e = strings.TrimSpace(e)
	if strings.Contains(e, "/") {
		p, perr := netip.ParsePrefix(e)
		if perr != nil {
			return "", netip.Prefix{}, false, fmt.Errorf("allowed worker %q: invalid CIDR: %v", e, perr)
		}
		return "", p.Masked(), true, nil
	}
	ip := strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")
	if a, perr := netip.ParseAddr(ip); perr == nil {
		if a.Zone() != "" {
			return "", netip.Prefix{}, false, fmt.Errorf("allowed worker %q: zoned address", e)
		}
		return "", netip.PrefixFrom(a, a.BitLen()), true, nil
	}
	h := strings.ToLower(e)
	if !validHostname(h) {
		return "", netip.Prefix{}, false, fmt.Errorf("allowed worker %q: want a hostname (no port, no scheme) or a CIDR", e)
	}
	return h, netip.Prefix{}, false, nil
}

// validHostname accepts lower-case ASCII letter-digit-hyphen(-underscore)
// labels of 1..63 bytes, 253 bytes in all, with an optional trailing dot.
func validHostname(h string) bool {
	h2 := strings.TrimSuffix(h, ".")
	if h2 == "" || len(h2) > 253 {
		return false
	}
	for _, label := range strings.Split(h2, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Admit reports whether the admin API may register rawURL; call it before
// Add for URLs that come from requests (Add itself stays unrestricted for the
// operator's --worker-urls and config). The error wraps ErrNotAllowed when
// the URL is not "http(s)://host[:port][@rank]" — another scheme, userinfo
// ("http://allowed@evil"), a path, query or fragment, a malformed host or
// port — or when its host is outside Config.AllowedWorkers.
//
// Matching: a hostname must equal a hostname entry, case-insensitively and
// exactly (a trailing dot makes a different, absolute name, matched only by
// an entry with the dot: "vllm-0." need not be what the search domains make
// of "vllm-0"); an IP literal (IPv4, or IPv6 in brackets, no zone) must lie
// in a CIDR entry. A hostname is never resolved to be matched against the
// CIDRs: the router dials later, and a name under an attacker's control can
// resolve to an allowed address when checked and to another one when dialed
// (DNS rebinding). Numeric forms that are not canonical IP literals
// ("10.1", "0x0a000001", "010.0.0.1") are hostnames here, so no CIDR admits
// them. Safe for concurrent use; no I/O.
func (r *Registry) Admit(rawURL string) error {
	host, err := urlHost(rawURL)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotAllowed, err)
	}
	a := r.allow.Load()
	if a.any {
		return nil
	}
	if ip, perr := netip.ParseAddr(host); perr == nil {
		for _, p := range a.nets {
			if p.Contains(ip) || p.Contains(ip.Unmap()) {
				return nil
			}
		}
		return fmt.Errorf("%w: %s: address not in the allowed networks", ErrNotAllowed, strings.TrimSpace(rawURL))
	}
	if _, ok := a.hosts[host]; ok {
		return nil
	}
	return fmt.Errorf("%w: %s: host not in the allowed list", ErrNotAllowed, strings.TrimSpace(rawURL))
}

// urlHost checks a worker URL strictly and returns its host: lower-cased
// hostname, or an IP literal without brackets.
func urlHost(rawURL string) (string, error) {
	s := strings.TrimSpace(rawURL)
	// Trailing slashes are forgiven (as ParseWorkerURL does); any other
	// path, query, fragment or backslash is refused before ParseWorkerURL
	// could mistake what follows it for the host.
	if scheme, rest, ok := strings.Cut(s, "://"); !ok || (scheme != "http" && scheme != "https") {
		return "", fmt.Errorf("%q: want an http or https URL", rawURL)
	} else if strings.ContainsAny(strings.TrimRight(rest, "/"), "/?#\\") {
		return "", fmt.Errorf("%q: a worker URL has no path, query or fragment", rawURL)
	}
	base, _, err := ParseWorkerURL(s) // rejects userinfo ('@' that is not a rank)
	if err != nil {
		return "", err
	}
	_, hostport, _ := strings.Cut(base, "://")
	var host, port string
	if strings.HasPrefix(hostport, "[") {
		i := strings.IndexByte(hostport, ']')
		if i < 0 {
			return "", fmt.Errorf("%q: unterminated IPv6 literal", rawURL)
		}
		host, port = hostport[1:i], hostport[i+1:]
		a, perr := netip.ParseAddr(host)
		if perr != nil || !a.Is6() || a.Zone() != "" {
			return "", fmt.Errorf("%q: invalid IPv6 literal", rawURL)
		}
		host = a.String()
	} else {
		host, port = hostport, ""
		if i := strings.IndexByte(hostport, ':'); i >= 0 {
			host, port = hostport[:i], hostport[i:]
		}
		host = strings.ToLower(host)
		if a, perr := netip.ParseAddr(host); perr == nil {
			if !a.Is4() {
				return "", fmt.Errorf("%q: invalid host", rawURL)
			}
		} else if !validHostname(host) {
			return "", fmt.Errorf("%q: invalid host", rawURL)
		}
	}
	if port != "" {
		p, perr := strconv.Atoi(strings.TrimPrefix(port, ":"))
		if port[0] != ':' || perr != nil || p < 1 || p > 65535 || strings.ContainsAny(port[1:], "+-") {
			return "", fmt.Errorf("%q: invalid port", rawURL)
		}
	}
	return host, nil
}
