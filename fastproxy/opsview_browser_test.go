package fastproxy_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// chromium returns the headless browser's path, or skips the test when
// there is none (fails instead with WARMROUTE_REQUIRE_CHROMIUM=1).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("WARMROUTE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium is not on PATH and WARMROUTE_REQUIRE_CHROMIUM=1")
	}
	t.Skip("chromium is not on PATH (set WARMROUTE_REQUIRE_CHROMIUM=1 to require it)")
	return ""
}

// runChromium runs a headless chromium with its own profile directory and
// returns its standard output.
func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--hide-scrollbars", "--run-all-compositor-stages-before-draw", "--virtual-time-budget=2000", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// TestOperatorPageInABrowser: headless Chromium renders the page of a live
// router (three workers, the demo's logical model, sessions, a request in
// flight): the screenshot is a 1280×900 PNG that is not blank, and the DOM
// holds the worker table and no script. With WARMROUTE_SCREENSHOT_OUT set,
// the screenshot is written there (bench/results/operator-page.png).
func TestOperatorPageInABrowser(t *testing.T) {
	bin := chromium(t)
	sim := fastSim()
	sim.MaxTokens, sim.TimeScale = 24, 0.3 // the slow requests below last a few seconds
	f := startOpsFleet(t, true, sim, nil)
	f.chat(t, "auto", injection, "hello from a hostile client")
	turns := []struct{ session, model, text string }{
		{"sess-4f1c9a", "auto", "prove that the sum of two even numbers is even, step by step"},
		{"sess-8b22e0", "auto", "refactor this python def so it handles a stack trace"},
		{"sess-a93d17", "auto", "what is a good name for a bakery?"},
		{"sess-c0ffee", "sim-small", "summarize our meeting notes"},
		{"sess-d41d8c", "sim-medium", "translate this paragraph into French"},
		{"sess-e7b3a2", "auto", "derive the closed form of the geometric series"},
	}
	history := strings.Repeat("Earlier in this conversation we discussed the itinerary in detail. ", 12)
	for round := 0; round < 3; round++ {
		for _, tr := range turns {
			f.chat(t, tr.model, tr.session, history+tr.text)
		}
	}
	// Requests in flight while the load is scraped and the page is read.
	slow := chatBody("sim-large", "write a long essay on caching", false)
	slow = strings.Replace(slow, `"messages"`, `"max_tokens":2500,"messages"`, 1)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(t, "POST", f.url+chatPath, slow, map[string]string{"X-Session-ID": "sess-long-9"})
		}()
	}
	defer wg.Wait()
	testwait.Until(t, "the slow requests in flight", func() bool {
		n := int64(0)
		for _, w := range f.reg.Workers() {
			n += w.Load()
		}
		return n == 3
	})
	f.reg.ScrapeLoadOnce(context.Background())

	url := f.admin + "/ui?refresh=0"
	out := filepath.Join(t.TempDir(), "page.png")
	runChromium(t, bin, "--screenshot="+out, "--window-size=1280,900", url)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if sz := img.Bounds().Size(); sz.X != 1280 || sz.Y != 900 {
		t.Fatalf("screenshot is %v, want 1280×900", sz)
	}
	colours := map[uint32]bool{}
	for y := 0; y < 900 && len(colours) < 64; y += 3 {
		for x := 0; x < 1280; x += 3 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[r>>8<<16|g>>8<<8|b>>8] = true
		}
	}
	if len(colours) < 16 {
		t.Fatalf("screenshot looks blank: %d colours", len(colours))
	}
	if dst := os.Getenv("WARMROUTE_SCREENSHOT_OUT"); dst != "" {
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot (%d bytes) written to %s", len(b), dst)
	}

	dom := string(runChromium(t, bin, "--dump-dom", url))
	if !strings.Contains(dom, `<table id="workers">`) {
		t.Fatalf("no worker table in the DOM:\n%s", dom)
	}
	for _, u := range f.urls {
		if !strings.Contains(dom, u) {
			t.Errorf("worker %s not in the DOM", u)
		}
	}
	if strings.Contains(strings.ToLower(dom), "<script") {
		t.Fatalf("the DOM holds a script:\n%s", dom)
	}
	if !strings.Contains(dom, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the hostile session id is not shown as text")
	}
}
