package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/saar"
)

// replayCmd is `warmroute replay [--config FILE] RECORDS.jsonl`: it re-runs
// every recorded model-step decision through the policy and reports each
// one that comes out differently. Exit 1 when any differs.
func replayCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warmroute replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "the config the records were made with (default: the embedded demo config)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: warmroute replay [--config FILE] RECORDS.jsonl")
		return 2
	}
	var cfg *saar.Config
	var err error
	if *config != "" {
		cfg, err = saar.LoadConfig(*config)
	} else {
		cfg, err = saar.ParseConfig(examples.Demo)
	}
	if err != nil {
		fmt.Fprintln(stderr, "warmroute replay:", err)
		return 2
	}
	rep, err := saar.ReplayFile(fs.Arg(0), cfg)
	if err != nil {
		fmt.Fprintln(stderr, "warmroute replay:", err)
		return 2
	}
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		fmt.Fprintln(stderr, "warmroute replay:", err)
		return 2
	}
	fmt.Fprintln(stdout, string(out))
	if other := rep.Records - rep.Configs[cfg.Revision] - rep.Configs[""]; other > 0 {
		// A reload changed the config while the records were made
		// (docs/design.md §8.5): their differences may be the config's.
		fmt.Fprintf(stderr, "warmroute replay: %d of %d records were decided under another config than %s (revision %s); replay each under its own\n",
			other, rep.Records, cmp.Or(*config, "the demo config"), cfg.Revision)
	}
	if len(rep.Diffs) > 0 {
		fmt.Fprintf(stderr, "warmroute replay: %d of %d decisions differ\n", len(rep.Diffs), rep.Records)
		return 1
	}
	fmt.Fprintf(stderr, "warmroute replay: all %d decisions reproduced\n", rep.Records)
	return 0
}
