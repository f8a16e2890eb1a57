package reqview

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/bytedance/sonic/encoder"
)

func TestGenerateKey(t *testing.T) {
	var v View
	key := func(body string) string {
		t.Helper()
		if err := Parse(&v, []byte(body), Generate); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return string(v.History)
	}
	a := key(`{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":16}}`)
	if a != "1,2,3," || v.MaxTokens != 16 || string(v.Model) != "m" {
		t.Fatalf("key %q max_tokens %d model %q", a, v.MaxTokens, v.Model)
	}
	if b := key("{\"token_ids\" : [ 1 ,\n 2,\t3 ] }"); b != a {
		t.Fatalf("two spellings of one array: %q and %q", a, b)
	}
	if b := key(`{"token_ids":[1,2,3,40,5]}`); !strings.HasPrefix(b, a) {
		t.Fatalf("an extension's key %q does not start with %q", b, a)
	}
	if b := key(`{"token_ids":[1,2,34]}`); strings.HasPrefix(b, a) {
		t.Fatalf("[1,2,34] matches [1,2,3] whole: %q", b)
	}
	for _, body := range []string{`{"token_ids":[]}`, `{"token_ids":"1,2"}`, `{}`} {
		if k := key(body); k != "" {
			t.Fatalf("%s: key %q, want none", body, k)
		}
	}
	if key(`{"token_ids":[1]}`); Parse(&v, []byte(`{"token_ids":[1]}`), Completions) != nil || len(v.History) != 0 {
		t.Fatalf("completions read token_ids: %q", v.History)
	}
	if err := Parse(&v, []byte(`{"token_ids":[1,]}`), Generate); !errors.Is(err, ErrMalformed) {
		t.Fatalf("malformed array accepted: %v", err)
	}
}

func TestMaxTokens(t *testing.T) {
	var v View
	for body, want := range map[string]int{
		`{"max_tokens":64}`: 64, `{"max_completion_tokens":7,"max_tokens":3}`: 7, `{"max_output_tokens":9}`: 9,
		`{"max_tokens":1.5}`: 0, `{"max_tokens":"8"}`: 0, `{"max_tokens":-4}`: 0, `{"max_tokens":1e3}`: 0, `{}`: 0,
		`{"sampling_params":{"max_tokens":12}}`: 0, // top level only outside Generate
	} {
		for _, parse := range []func() error{
			func() error { return Parse(&v, []byte(body), Chat) },
			func() error { return ParseModel(&v, []byte(body)) },
		} {
			if err := parse(); err != nil || v.MaxTokens != want {
				t.Errorf("%s: MaxTokens %d (%v), want %d", body, v.MaxTokens, err, want)
			}
		}
	}
}

// FuzzGenerate: Parse with kind Generate never panics, accepts only what
// sonic accepts, gives one key per parse, and the key of a valid body is
// its integer token ids, each followed by a comma.
func FuzzGenerate(f *testing.F) {
	for _, s := range []string{`{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":16,"temperature":0}}`,
		`{"token_ids":[ 1 , 2 ]}`, `{"token_ids":[]}`, `{"token_ids":[1,"a",{"b":[2]}]}`, `{"token_ids":[1,]}`,
		`{"token_ids":5,"stream":true}`, `{"sampling_params":{"max_tokens":"\q"}}`, `{"token_ids":[1],"token_ids":[2]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v View
		v.Reset()
		v.parse(data, skipWS(data, 0), Generate)
		err := Parse(&v, data, Generate)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if ok, _ := encoder.Valid(data); !ok {
			t.Fatalf("Parse accepted what sonic rejects: %q", data)
		}
		key := string(v.History)
		if Parse(&v, data, Generate) != nil || string(v.History) != key {
			t.Fatalf("second parse differs: %q", data)
		}
		var m struct {
			TokenIDs []int `json:"token_ids"`
		}
		if json.Unmarshal(data, &m) != nil || len(m.TokenIDs) == 0 {
			return
		}
		var want strings.Builder
		for _, id := range m.TokenIDs {
			want.WriteString(strconv.Itoa(id) + ",")
		}
		if strings.Count(string(data), "token_ids") == 1 && key != want.String() {
			t.Fatalf("key %q, want %q: %q", key, want.String(), data)
		}
	})
}
