package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Router configurations compared.
const (
	cfgPass = "pass-through" // no router queue: every request to a worker up to --max-concurrent-requests
	cfgFIFO = "fifo"         // the router queue released in arrival order (the vLLM router's queue)
	cfgNew  = "new"          // the router queue: priority, tenant fairness, warm tool-loop turns, oldest
)

var allConfigs = []string{cfgPass, cfgFIFO, cfgNew}

// routerConfig is one configuration: its name and the flags that make it.
type routerConfig struct {
	name string
	args []string
}

// configurations returns the configurations of names that bin can run (in
// allConfigs' order) and one line for each it cannot: fifo and new need
// --queue-size and --queue-order. Every configuration gets common and
// --router-args; new also --new-args.
func configurations(b *binary, names []string, o *options, common []string) (run []routerConfig, skipped []string) {
	queue := b.flags["queue-size"] && b.flags["queue-order"]
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, name := range allConfigs {
		if !want[name] {
			continue
		}
		args := append([]string(nil), common...)
		switch {
		case name == cfgPass && b.flags["queue-size"]:
			args = append(args, "--queue-size", "0")
		case name == cfgPass:
			// today's router: no queue to turn off
		case !queue:
			skipped = append(skipped, name+": the router binary has no --queue-size/--queue-order (its -h)")
			continue
		default:
			order := "priority"
			if name == cfgFIFO {
				order = "fifo"
			}
			args = append(args, "--queue-order", order)
			if o.queueSize > 0 {
				args = append(args, "--queue-size", strconv.Itoa(o.queueSize))
			}
			if b.flags["queue-timeout-secs"] {
				args = append(args, "--queue-timeout-secs", strconv.Itoa(o.queueTimeout))
			}
		}
		args = append(args, o.routerArgs...)
		if name == cfgNew {
			args = append(args, o.newArgs...)
		}
		run = append(run, routerConfig{name: name, args: args})
	}
	return run, skipped
}

// commonArgs are the flags of every configuration: the load scrape period,
// the tenants' keys (written to dir), a short drain.
func commonArgs(b *binary, o *options, dir string) ([]string, error) {
	keys, err := writeKeys(b, dir)
	if err != nil {
		return nil, err
	}
	args := []string{"--worker-load-scrape-interval-secs", strconv.FormatFloat(o.scrape, 'g', -1, 64), "--client-api-keys", keys}
	if b.flags["shutdown-grace-secs"] {
		args = append(args, "--shutdown-grace-secs", "1")
	}
	return args, nil
}

// tenantKey is the bearer token of tenant i.
func tenantKey(i int) string { return "overload-key-" + tenantNames[i] }

// writeKeys writes the --client-api-keys file: name:key lines where the
// binary documents them, else bare keys (the router then names a tenant by
// a hash of its key).
func writeKeys(b *binary, dir string) (string, error) {
	var sb strings.Builder
	for i := range tenantNames {
		if b.namedKeys {
			fmt.Fprintf(&sb, "%s:", tenantNames[i])
		}
		sb.WriteString(tenantKey(i) + "\n")
	}
	path := filepath.Join(dir, "client-keys")
	return path, os.WriteFile(path, []byte(sb.String()), 0o600)
}
