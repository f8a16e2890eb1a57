package k8swatch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

const bootstrapKey = "vllm.ai/bootstrap-port"

// TestDecodeRecordedList: a PodList page as the API reference gives it
// (continue token, a ready pod with the bootstrap-port annotation, a
// pending one) decodes to what the discovery needs.
func TestDecodeRecordedList(t *testing.T) {
	b, err := os.ReadFile("testdata/podlist.json")
	if err != nil {
		t.Fatal(err)
	}
	var page podListJSON
	if err := json.Unmarshal(b, &page); err != nil {
		t.Fatal(err)
	}
	if page.Metadata.ResourceVersion != "48213" || page.Metadata.Continue == "" || len(page.Items) != 2 {
		t.Fatalf("list metadata %+v, %d items", page.Metadata, len(page.Items))
	}
	p0, p1 := page.Items[0].pod([]string{bootstrapKey}), page.Items[1].pod([]string{bootstrapKey})
	if p0.Key() != "inference/vllm-prefill-0" || p0.IP != "10.244.3.21" || !p0.Ready || p0.Annotations[bootstrapKey] != "8998" || len(p0.Annotations) != 1 {
		t.Errorf("ready pod: %+v", p0)
	}
	if p1.Ready || p1.IP != "" || p1.Annotations != nil {
		t.Errorf("pending pod: %+v", p1)
	}
}

// TestDecodeRecordedWatch: the recorded stream's events, in order: a
// ready decode pod added, the prefill pod not ready, then terminating
// (ready condition but deletionTimestamp: not ready), a bookmark, its
// deletion, an ERROR 410.
func TestDecodeRecordedWatch(t *testing.T) {
	f, err := os.Open("testdata/watch.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var got []string
	for {
		fr, err := readFrame(br, nil, 1<<20)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ev, err := decodeEvent(fr, []string{bootstrapKey})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{string(ev.Type), ev.Pod.Name, ev.Pod.IP, boolS(ev.Pod.Ready), ev.ResourceVersion, itoa(ev.Code)}, " "))
	}
	want := []string{
		"ADDED vllm-decode-0 10.244.5.9 ready 48214 0",
		"MODIFIED vllm-prefill-0 10.244.3.21 - 48220 0",
		"MODIFIED vllm-prefill-0 10.244.3.21 - 48231 0",
		"BOOKMARK   - 48240 0",
		"DELETED vllm-prefill-0  - 48252 0",
		"ERROR   -  410",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func boolS(b bool) string {
	if b {
		return "ready"
	}
	return "-"
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestReadFrame: objects are split on their braces, strings and escapes
// included, whatever the whitespace between them; an oversized object, a
// cut one and garbage are errors.
func TestReadFrame(t *testing.T) {
	in := `{"a":"}{\"}"} {"b":[{"c":1}]}` + "\n\n" + `{"d":"\\"}`
	br := bufio.NewReader(strings.NewReader(in))
	var got []string
	for {
		fr, err := readFrame(br, nil, 100)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(fr))
	}
	if want := []string{`{"a":"}{\"}"}`, `{"b":[{"c":1}]}`, `{"d":"\\"}`}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("frames %q", got)
	}
	for in, want := range map[string]error{
		`{"a":"` + strings.Repeat("x", 200) + `"}`: errTooLarge,
		`{"a":1`:   io.ErrUnexpectedEOF,
		`x{"a":1}`: errFrame,
	} {
		if _, err := readFrame(bufio.NewReader(strings.NewReader(in)), nil, 100); !errors.Is(err, want) {
			t.Errorf("%.20q: err %v, want %v", in, err, want)
		}
	}
}

// FuzzDecodeEvent: no input panics the frame reader or the decoder, a
// frame never exceeds its bound, and a decoded pod event names its pod.
func FuzzDecodeEvent(f *testing.F) {
	if b, err := os.ReadFile("testdata/watch.jsonl"); err == nil {
		for _, line := range bytes.Split(b, []byte("\n")) {
			f.Add(line)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"type":"ADDED","object":{"metadata":{"name":"p","annotations":{"vllm.ai/bootstrap-port":"x"}},"status":{"phase":"Running","podIP":"::1"}}}`))
	f.Add([]byte(`{"type":"ERROR","object":{"code":"410"}}`))
	f.Add([]byte(`{"type":"BOOKMARK","object":[]}{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		for {
			fr, err := readFrame(br, nil, 512)
			if err != nil {
				return
			}
			if len(fr) > 512 {
				t.Fatalf("frame of %d bytes", len(fr))
			}
			ev, err := decodeEvent(fr, []string{bootstrapKey})
			if err == nil && (ev.Type == Added || ev.Type == Modified || ev.Type == Deleted) && ev.Pod.Name == "" {
				t.Fatalf("pod event without a name from %q", fr)
			}
		}
	})
}

// FuzzParseSelector: a selector that parses prints as the labelSelector
// parameter, which parses back to the same selector and matches the
// labels it names.
func FuzzParseSelector(f *testing.F) {
	f.Add("app=vllm,vllm.ai/role=prefill")
	f.Add("a=,b=c")
	f.Add("x.y/z=1,=,a==b")
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSelector(strings.Split(in, ","))
		if err != nil {
			return
		}
		back, err := ParseSelector(strings.Split(s.String(), ","))
		if err != nil || back.String() != s.String() {
			t.Fatalf("%q printed %q, parsed back %q (%v)", in, s.String(), back.String(), err)
		}
		if !s.Matches(map[string]string(s)) {
			t.Fatalf("%q does not match its own labels", in)
		}
	})
}
