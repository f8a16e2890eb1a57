package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// escapeKinds are the body kinds of --kinds: a coding agent's chat, dense
// with escapes, of exactly this many bytes (the load test's escape-dense
// case, issue 28).
var escapeKinds = map[string]int{"esc16k": 16 << 10}

// withEscapeDense returns a copy of body m (the sample body of the same size,
// its model, stream and max_tokens already set) whose messages are a coding
// agent's conversation: the same system prompt, then turns of a user asking
// about code, a run_python tool call (the code JSON-encoded inside the
// arguments string, so escaped twice), the tool's output (test failures,
// tab-separated go test lines, a tree, a diff, Windows paths) and an
// assistant reply with code, ending with a user message. Their text is
// thick with quotes, tabs, newlines, backslashes and non-ASCII; the tool
// messages carry their non-ASCII as \uXXXX escapes (surrogate pairs for
// emoji), as Python's json.dumps writes it, the others as raw UTF-8, as Go
// and JavaScript write it, so a parser meets both. The last user message is
// cut or padded so that json.Marshal of the result is exactly size bytes.
func withEscapeDense(m map[string]json.RawMessage, size int) (map[string]json.RawMessage, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		return nil, fmt.Errorf("escape-dense body: the sample body has no messages")
	}
	system := msgs[0]
	body := func(turns int, last string) (map[string]json.RawMessage, int, error) {
		c, err := withMessages(m, append([]json.RawMessage{system}, agentTurns(turns)...), last)
		if err != nil {
			return nil, 0, err
		}
		n, err := marshalledLen(c)
		return c, n, err
	}
	turns := 0 // the most turns whose body, with the last message empty, fits
	for ; ; turns++ {
		_, n, err := body(turns+1, "")
		if err != nil {
			return nil, err
		}
		if n > size {
			break
		}
	}
	_, n, err := body(turns, "")
	if err != nil {
		return nil, err
	}
	if n > size {
		return nil, fmt.Errorf("escape-dense body: %d bytes hold not even the system prompt", size)
	}
	c, n, err := body(turns, fitJSON(strings.Repeat(userText(turns)+"\n\n"+toolOutput(turns)+"\n", 8), size-n))
	if err != nil {
		return nil, err
	}
	if n != size {
		return nil, fmt.Errorf("escape-dense body: %d bytes, want %d", n, size)
	}
	return c, nil
}

// withMessages returns a copy of m with messages msgs and then a user
// message of text last.
func withMessages(m map[string]json.RawMessage, msgs []json.RawMessage, last string) (map[string]json.RawMessage, error) {
	all := append(msgs[:len(msgs):len(msgs)], rawMessage(false, map[string]any{"role": "user", "content": last}))
	c := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		c[k] = v
	}
	var err error
	c["messages"], err = json.Marshal(all)
	return c, err
}

func marshalledLen(m map[string]json.RawMessage) (int, error) {
	b, err := json.Marshal(m)
	return len(b), err
}

// agentTurns returns turns turns of the conversation (without the user
// message that follows them): user, assistant tool call, tool output,
// assistant reply.
func agentTurns(turns int) []json.RawMessage {
	var msgs []json.RawMessage
	for k := range turns {
		id := fmt.Sprintf("call_%04d", 7000+k)
		args, _ := json.Marshal(map[string]any{"code": pythonCode(k), "timeout": 30})
		msgs = append(msgs,
			rawMessage(false, map[string]any{"role": "user", "content": userText(k)}),
			rawMessage(false, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": id, "type": "function", "function": map[string]any{"name": "run_python", "arguments": string(args)},
			}}}),
			rawMessage(true, map[string]any{"role": "tool", "tool_call_id": id, "content": toolOutput(k)}),
			rawMessage(false, map[string]any{"role": "assistant", "content": assistantReply(k)}),
		)
	}
	return msgs
}

// rawMessage is msg as JSON, its non-ASCII escaped as \uXXXX when ascii.
func rawMessage(ascii bool, msg map[string]any) json.RawMessage {
	b, err := json.Marshal(msg)
	if err != nil {
		fail(err)
	}
	if ascii {
		b = asciiEscaped(b)
	}
	return b
}

// asciiEscaped returns JSON text j with every non-ASCII character written as
// a \uXXXX escape, a surrogate pair above U+FFFF (json.dumps' default).
// Non-ASCII occurs only inside JSON strings, so the text stays valid and
// decodes to the same value.
func asciiEscaped(j []byte) []byte {
	b := make([]byte, 0, len(j)+len(j)/4)
	for _, r := range string(j) {
		switch {
		case r < utf8.RuneSelf:
			b = append(b, byte(r))
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			b = fmt.Appendf(b, `\u%04x\u%04x`, hi, lo)
		default:
			b = fmt.Appendf(b, `\u%04x`, r)
		}
	}
	return b
}

// fitJSON returns the longest rune prefix of s whose JSON string encoding
// (json.Marshal, less the quotes) is at most n bytes, padded with spaces to
// exactly n.
func fitJSON(s string, n int) string {
	rs := []rune(s)
	k := sort.Search(len(rs)+1, func(i int) bool { return encodedLen(string(rs[:i])) > n }) - 1
	p := string(rs[:max(k, 0)])
	return p + strings.Repeat(" ", max(n-encodedLen(p), 0))
}

func encodedLen(s string) int {
	b, _ := json.Marshal(s)
	return len(b) - 2
}

// The conversation's text, three variations in turn, with the turn's number
// in line numbers and names so that no two turns are the same.

func userText(k int) string {
	switch k % 3 {
	case 0:
		return fmt.Sprintf("The lexer rejects “smart quotes” — fix `unquote` in internal/lex/lex.go (line %d) so that\n"+
			"\t\"“a”\" → \"a\"\n\t'‘b’' → \"b\"\nand keep `\\\"` and `\\\\` working. The failing test is lex_test.go:%d; "+
			"run it with -run 'TestUnquote/quotes_\\d+'.", 40+k, 100+k)
	case 1:
		return fmt.Sprintf("Now the Windows build: paths like \"C:\\\\Users\\\\dev\\\\src\\\\tool%d\\\\testdata\" come back with "+
			"doubled backslashes, and the file 日本語_%d.txt is skipped. Check `walk` and print the tree — naïve fixes broke CI before.", k, k)
	default:
		return fmt.Sprintf("Tests pass 🙂 but the tab-separated report (\"name\\tstatus\\tms\") is misaligned when a name "+
			"has “wide” characters (e.g. 测试用例_%d). Make the columns line up; keep the TSV as\n\tname<TAB>status<TAB>ms\n"+
			"and show me the diff.", k)
	}
}

func pythonCode(k int) string {
	switch k % 3 {
	case 0:
		return fmt.Sprintf("import json, re, subprocess\n"+
			"out = subprocess.run([\"go\", \"test\", \"-run\", \"TestUnquote/quotes_%d\", \"./internal/lex/\"],\n"+
			"\tcapture_output=True, text=True)\n"+
			"for line in out.stdout.splitlines():\n"+
			"\tif re.search(r\"^\\s+\\w+_test\\.go:\\d+:\", line):\n"+
			"\t\tprint(\"\\t\" + line.replace(\"\\\\\", \"\\\\\\\\\"))\n"+
			"print(json.dumps({\"rc\": out.returncode, \"tail\": out.stdout[-120:]}))\n", k)
	case 1:
		return fmt.Sprintf("import os, pathlib\n"+
			"root = pathlib.PureWindowsPath(r\"C:\\Users\\dev\\src\\tool%d\")\n"+
			"for dirpath, dirs, files in os.walk(\"testdata\"):\n"+
			"\tfor f in sorted(files):\n"+
			"\t\tp = os.path.join(dirpath, f)\n"+
			"\t\tprint(f\"{p!r}\\t{os.path.getsize(p)}\\t{str(root / p)!r}\")\n", k)
	default:
		return fmt.Sprintf("import unicodedata\n"+
			"def width(s):\n"+
			"\treturn sum(2 if unicodedata.east_asian_width(c) in \"WF\" else 1 for c in s)\n"+
			"rows = [l.split(\"\\t\") for l in open(\"report_%d.tsv\", encoding=\"utf-8\")]\n"+
			"w = max(width(r[0]) for r in rows)\n"+
			"for r in rows:\n"+
			"\tprint(r[0] + \" \" * (w - width(r[0])), *r[1:], sep=\"\\t\", end=\"\")\n", k)
	}
}

func toolOutput(k int) string {
	switch k % 3 {
	case 0:
		return fmt.Sprintf("--- FAIL: TestUnquote (0.00s)\n"+
			"    --- FAIL: TestUnquote/quotes_%d (0.00s)\n"+
			"        lex_test.go:%d: unquote(\"\\\"“a”\\\"\") = \"\", want \"a\"\n"+
			"        lex_test.go:%d: unquote(\"'‘b’'\") = \"\", want \"b\"\n"+
			"        lex_test.go:%d: unquote(\"\\\"a\\\\tb\\\"\") = \"a\\\\tb\", want \"a\\tb\"\n"+
			"FAIL\n"+
			"FAIL\tgithub.com/acme/tool/internal/lex\t0.004s\n"+
			"{\"rc\": 1, \"tail\": \"...want \\\"a\\\\tb\\\"\\nFAIL\\tgithub.com/acme/tool/internal/lex\\t0.004s\\n\"}\n",
			k, 100+k, 104+k, 108+k)
	case 1:
		return fmt.Sprintf("'testdata/quotes.txt'\t412\t'C:\\\\Users\\\\dev\\\\src\\\\tool%d\\\\testdata\\\\quotes.txt'\n"+
			"'testdata/日本語_%d.txt'\t96\t'C:\\\\Users\\\\dev\\\\src\\\\tool%d\\\\testdata\\\\日本語_%d.txt'\n"+
			"'testdata/naïve café.txt'\t38\t'C:\\\\Users\\\\dev\\\\src\\\\tool%d\\\\testdata\\\\naïve café.txt'\n"+
			"testdata\n├── quotes.txt      # “curly” and ‘single’\n├── 日本語_%d.txt\n└── naïve café.txt\n"+
			"✅ 3 files, ❌ 1 skipped (\"\\\\?\\\\C:\\\\…\" prefix) 🙂\n", k, k, k, k, k, k)
	default:
		return fmt.Sprintf("name\tstatus\tms\n"+
			"测试用例_%d\tok\t12\n"+
			"quotes “curly”\tok\t3\n"+
			"path\\\\to\\\\file\tFAIL\t7\n"+
			"--- a/report.py\n+++ b/report.py\n"+
			"@@ -%d,3 +%d,4 @@ def row(r):\n"+
			"-\treturn \"\\t\".join(r)\n"+
			"+\tname = r[0] + \" \" * (w - width(r[0]))\n"+
			"+\treturn \"\\t\".join([name, *r[1:]])\n"+
			"  # → aligned: 2 columns per “wide” character 👍\n", k, 10+k, 10+k)
	}
}

func assistantReply(k int) string {
	switch k % 3 {
	case 0:
		return fmt.Sprintf("The failure is in `unquote`: it accepts only ASCII `\"` and `'`, so “a” falls through to "+
			"strconv.Unquote and fails. Fix (line %d):\n\n~~~go\nfunc unquote(s string) (string, error) {\n"+
			"\tfor _, q := range [][2]string{{\"“\", \"”\"}, {\"‘\", \"’\"}} {\n"+
			"\t\tif strings.HasPrefix(s, q[0]) && strings.HasSuffix(s, q[1]) {\n"+
			"\t\t\treturn s[len(q[0]) : len(s)-len(q[1])], nil\n\t\t}\n\t}\n"+
			"\treturn strconv.Unquote(s) // handles \\\" and \\\\\n}\n~~~\n\nAfter the change: ✓ quotes_%d, ✓ escapes.", 40+k, k)
	case 1:
		return fmt.Sprintf("`walk` joins with \"/\" and then `filepath.FromSlash` runs twice, which doubles every \"\\\\\". "+
			"The skipped file is a normalisation issue (NFD vs NFC for “naïve”), not the Japanese name:\n\n~~~go\n"+
			"\tp := filepath.Join(root, norm.NFC.String(name)) // C:\\\\Users\\\\dev\\\\src\\\\tool%d\n"+
			"\tif strings.HasPrefix(p, `\\\\?\\`) {\n\t\tp = p[4:]\n\t}\n~~~\n\nAll %d files are listed now — see the tree above.", k, 3+k)
	default:
		return fmt.Sprintf("Column width must count East-Asian wide characters as 2: 测试用例_%d is 10 columns, not 6. "+
			"The diff pads the name before joining with \"\\t\"; the TSV itself is unchanged:\n\n~~~\n"+
			"name        \tstatus\tms\n测试用例_%d \tok\t12\n~~~\n\n→ `python report.py | column -t -s $'\\t'` lines up too.", k, k)
	}
}
