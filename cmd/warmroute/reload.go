package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/saar"
)

// Live reload (docs/design.md §8, "Reload and audit"): SIGHUP and POST
// /reload re-read --config, every file flag and the secrets' files. All are
// read and checked first (files); a fault rejects the reload whole, and the
// running configuration stays. Then they are applied, each behind an
// atomic pointer, so a request in flight sees one configuration: the
// config's new workers join, the model step takes the new config, the
// config's dropped workers drain, the keys and the allow-list are swapped,
// new TLS handshakes take the new certificate and the audit log is
// reopened. Connections, sessions, locks and the prefix tree are kept.

// files is what a reload reads: every file-backed setting, checked.
type files struct {
	cfg   *saar.Config // nil: no --config (the model step's config is not reloaded)
	auth  fastproxy.Auth
	allow []string         // --worker-allowlist and --worker-allowlist-file, parsed
	cert  *tls.Certificate // nil without TLS
	audit *os.File         // the reopened --audit-log; nil without one
}

// readAuth reads the keys: the client key file, the admin keys and the
// secrets.
func readAuth(o *options) (fastproxy.Auth, error) {
	var a fastproxy.Auth
	var err error
	if a.ClientAPIKeys, err = readKeys(o.clientAPIKeysFile); err != nil {
		return a, fmt.Errorf("--client-api-keys: %w", err)
	}
	if a.AdminAPIKeys, err = readKeys(o.adminAPIKeysFile); err != nil {
		return a, fmt.Errorf("--admin-api-keys-file: %w", err)
	}
	if a.APIKey, err = o.secrets.apiKey.read(); err != nil {
		return a, err
	}
	if a.AdminAPIKey, err = o.secrets.adminAPIKey.read(); err != nil {
		return a, err
	}
	return a, nil
}

// readAllowList is --worker-allowlist with the entries of
// --worker-allowlist-file (commas, spaces or lines; # comments). A file
// with no entry is an error: emptied by mistake it would allow any worker.
func readAllowList(o *options) ([]string, error) {
	s := o.workerAllowlist
	if o.workerAllowlistFile != "" {
		b, err := readSmallFile(o.workerAllowlistFile, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("--worker-allowlist-file: %w", err)
		}
		entries := allowListLines(b)
		if len(entries) == 0 {
			return nil, fmt.Errorf("--worker-allowlist-file %s: no entries (remove the flag to allow any worker)", o.workerAllowlistFile)
		}
		s += "," + strings.Join(entries, ",")
	}
	allow, err := loadview.ParseAllowList(s)
	if err != nil {
		return nil, fmt.Errorf("--worker-allowlist: %w", err)
	}
	return allow, nil
}

// readFiles reads and checks everything a reload applies, applying
// nothing: the config (withConfig; the start reads it before) (with the checks of the start: roles, a source of
// workers, each worker URL), the keys, the allow-list, the TLS pair, and
// opens the audit log.
func readFiles(o *options, withConfig bool) (*files, error) {
	f := &files{}
	var err error
	if withConfig && o.config != "" {
		cfg, err := loadConfig(o)
		if err == nil {
			err = checkConfigRoles(o, cfg)
		}
		if err == nil {
			err = needWorkers(o, cfg)
		}
		if err == nil {
			err = checkConfigURLs(o, cfg)
		}
		if err != nil {
			return nil, err
		}
		f.cfg = cfg
	}
	if f.auth, err = readAuth(o); err != nil {
		return nil, err
	}
	if f.allow, err = readAllowList(o); err != nil {
		return nil, err
	}
	if o.tlsCertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCertFile, o.tlsKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
		}
		f.cert = &cert
	}
	if o.auditLog != "" {
		if f.audit, err = openAudit(o.auditLog); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// allowListLines is the text of an allow-list file, # comments and blank
// lines dropped, one string per line (ParseAllowList splits the entries).
func allowListLines(b []byte) []string {
	var entries []string
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			entries = append(entries, line)
		}
	}
	return entries
}

// checkConfigURLs refuses a config whose worker URL the registry could not
// add.
func checkConfigURLs(o *options, cfg *saar.Config) error {
	for _, m := range cfg.Models {
		for _, u := range slices.Concat(m.Workers, m.PrefillWorkers, m.DecodeWorkers) {
			if _, _, err := loadview.ParseWorkerURL(u); err != nil {
				return fmt.Errorf("%s: model %s: %w", o.config, m.Name, err)
			}
		}
	}
	return nil
}

// configWorker is a worker the config lists: its models, in its role.
type configWorker struct {
	models []string
	role   loadview.Role
}

// configWorkers lists the config's workers in file order, each with the
// models that list it.
func configWorkers(cfg *saar.Config) ([]string, map[string]*configWorker) {
	var order []string
	byURL := map[string]*configWorker{}
	for _, m := range cfg.Models {
		for _, l := range []struct {
			urls []string
			role loadview.Role
		}{{m.Workers, loadview.Regular}, {m.PrefillWorkers, loadview.Prefill}, {m.DecodeWorkers, loadview.Decode}} {
			for _, u := range l.urls {
				e := byURL[u]
				if e == nil {
					e = &configWorker{role: l.role}
					byURL[u] = e
					order = append(order, u)
				}
				e.models = append(e.models, m.Name)
			}
		}
	}
	return order, byURL
}

// reloader applies reloads to the running router.
type reloader struct {
	o       *options
	reg     *loadview.Registry
	models  *saar.Router
	srv     *fastproxy.Server
	cert    *certificate // nil without TLS
	audit   *auditSink
	log     *slog.Logger
	applied map[string]*configWorker // the workers of the config in force
}

// reload reads and checks every file, then applies them (fastproxy.Server.
// Reload, which SIGHUP and POST /reload call, runs one at a time).
func (r *reloader) reload() error {
	f, err := readFiles(r.o, true)
	if err != nil {
		return err
	}
	if f.cfg != nil {
		if err := r.checkRoom(f.cfg); err != nil {
			f.audit.Close() //nolint:errcheck // nil-safe
			return err
		}
	}
	if f.cfg != nil && !r.o.demo {
		r.applyWorkers(f.cfg)
	} else if f.cfg != nil {
		r.models.SetConfig(f.cfg) // demo: the embedded workers stay
	}
	if err := r.reg.SetAllowedWorkers(f.allow); err != nil {
		return err // checked by ParseAllowList: not reached
	}
	r.srv.SetAuth(f.auth)
	if f.cert != nil {
		r.cert.set(f.cert)
	}
	if f.audit != nil {
		r.audit.swap(f.audit)
	}
	return nil
}

// checkRoom refuses a config whose new workers would pass --max-workers.
func (r *reloader) checkRoom(cfg *saar.Config) error {
	order, _ := configWorkers(cfg)
	n := len(r.reg.Workers())
	for _, u := range order {
		if _, ok := r.applied[u]; !ok && r.reg.ByURL(u) == nil {
			if _, rank, _ := loadview.ParseWorkerURL(u); rank < 0 {
				n += max(r.o.dpSize, 1)
			} else {
				n++
			}
		}
	}
	if n > r.o.maxWorkers {
		return fmt.Errorf("%s: %d workers with the new ones, more than --max-workers %d", r.o.config, n, r.o.maxWorkers)
	}
	return nil
}

// applyWorkers moves the fleet and the model step to cfg: the new
// workers join first (so that the new config finds them), then the model
// step takes cfg, then the workers cfg dropped leave (requests in flight on
// them finish: loadview.Registry.Remove) unless a flag names them. A
// worker whose models changed keeps its connections and state.
func (r *reloader) applyWorkers(cfg *saar.Config) {
	order, next := configWorkers(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var moved []string // the role changed: removed, then added again
	for _, u := range order {
		w, had := next[u], r.applied[u]
		switch {
		case had != nil && had.role != w.role:
			moved = append(moved, u)
		case had != nil && !slices.Equal(had.models, w.models):
			r.reg.SetModels(u, w.models)
		case had == nil:
			_, err := r.reg.AddRole(ctx, u, w.models, w.role)
			if errors.Is(err, loadview.ErrDuplicate) {
				// Added by the admin API or DNS: it takes the config's
				// models if they were fixed, and stays theirs (a later
				// config that drops it does not remove it).
				r.reg.SetModels(u, w.models)
				delete(next, u)
			} else if err != nil {
				r.log.Warn("reload: worker not added", "worker", u, "err", err)
				delete(next, u) // tried again by the next reload
			}
		}
	}
	r.models.SetConfig(cfg)
	flags := map[string]bool{}
	for _, f := range flagWorkers(r.o) {
		flags[f.url] = true
	}
	for u := range r.applied {
		if next[u] == nil && !flags[u] {
			r.reg.Remove(u)
		}
	}
	for _, u := range moved {
		r.reg.Remove(u)
		if _, err := r.reg.AddRole(ctx, u, next[u].models, next[u].role); err != nil {
			r.log.Warn("reload: worker not added in its new role", "worker", u, "err", err)
		}
	}
	r.applied = next
}

// certificate is the TLS pair new handshakes use (tls.Config.
// GetCertificate): a reload swaps it; open connections keep theirs.
type certificate struct {
	p atomic.Pointer[tls.Certificate]
}

func (c *certificate) set(cert *tls.Certificate) { c.p.Store(cert) }

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.p.Load(), nil }

// auditSink is the audit log's writer: --audit-log, reopened on reload
// (logrotate renames the file, then signals; the next line goes to a new
// file of the same name), or stderr. One Write per line.
type auditSink struct {
	mu     sync.Mutex
	f      *os.File  // nil: stderr
	stderr io.Writer // the process's stderr (run's)
}

func openAudit(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		return nil, fmt.Errorf("--audit-log: %w", err)
	}
	return f, nil
}

func (a *auditSink) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return a.stderr.Write(p)
	}
	return a.f.Write(p)
}

// swap writes the next lines to f and closes the file written so far.
func (a *auditSink) swap(f *os.File) {
	a.mu.Lock()
	old := a.f
	a.f = f
	a.mu.Unlock()
	if old != nil {
		old.Close() //nolint:errcheck
	}
}

// close closes the file at shutdown.
func (a *auditSink) close() { a.swap(nil) }

// hupSignals is the channel SIGHUP is delivered to; main reloads on each.
func hupSignals() chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c
}

// reloadOn calls srv.Reload for each signal on hup until ctx ends. A
// failed reload was logged and counted by Reload; the router serves on.
func reloadOn(ctx context.Context, hup <-chan os.Signal, srv *fastproxy.Server) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = srv.Reload()
		}
	}
}

// configWorkersOf is the config's workers a reload compares with: none in
// demo mode, whose workers are the embedded ones.
func configWorkersOf(o *options, cfg *saar.Config) map[string]*configWorker {
	if o.demo {
		return map[string]*configWorker{}
	}
	_, byURL := configWorkers(cfg)
	return byURL
}
