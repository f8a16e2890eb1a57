package fastproxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/route"
)

// docs/reference.md documents every surface of this package; these tests
// keep it from drifting as endpoints, headers, labels and errors change.

// referenceSection returns the text of the reference's "## name" section.
func referenceSection(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## "+name+"\n")
	if i < 0 {
		t.Fatalf("docs/reference.md has no section %q", name)
	}
	rest := doc[i+1:]
	if j := strings.Index(rest[3:], "\n## "); j >= 0 {
		rest = rest[:j+3]
	}
	return rest
}

func TestReferenceListsEveryEndpoint(t *testing.T) {
	sec := referenceSection(t, "Endpoints")
	for path := range newEndpointTable(nil) {
		if !strings.Contains(sec, "`"+path+"`") && !strings.Contains(sec, " "+path+"`") && !strings.Contains(sec, path+"?") {
			t.Errorf("endpoint %s is not in docs/reference.md's Endpoints", path)
		}
	}
}

func TestReferenceListsEveryResponseHeaderAndLabel(t *testing.T) {
	headers := strings.ToLower(referenceSection(t, "Response headers"))
	for _, h := range []string{hdrWorker, hdrBaseWorker, hdrDPRank, hdrDecision, hdrRequestID,
		hdrSelectedModel, hdrSelectedDecision, hdrSessionPhase, hdrSessionAction, hdrReplayID,
		hdrLimitRequests, hdrRemainingRequests, hdrResetRequests, hdrLimitTokens, hdrRemainingTokens, hdrResetTokens} {
		if !strings.Contains(headers, "`"+strings.ToLower(h)+"`") {
			t.Errorf("response header %s is not in docs/reference.md", h)
		}
	}
	labels := referenceSection(t, "Decision labels")
	for _, l := range route.Labels() {
		if !strings.Contains(labels, "`"+l+"`") {
			t.Errorf("decision label %s is not in docs/reference.md", l)
		}
	}
	metrics := referenceSection(t, "Metrics")
	for _, k := range failureKinds {
		if !strings.Contains(metrics, "`"+k+"`") {
			t.Errorf("upstream failure kind %s is not in docs/reference.md", k)
		}
	}
}

// Every error code the router answers with (the code argument of each
// writeError call in this package) has its row.
func TestReferenceListsEveryErrorCode(t *testing.T) {
	sec := referenceSection(t, "Errors")
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if id, isIdent := callName(call, ok); !isIdent || id != "writeError" || len(call.Args) != 5 {
				return true
			}
			lit, ok := call.Args[3].(*ast.BasicLit)
			if !ok {
				return true
			}
			code, _ := strconv.Unquote(lit.Value)
			seen++
			if !strings.Contains(sec, "`"+code+"`") {
				t.Errorf("%s: error code %s is not in docs/reference.md's Errors", fset.Position(call.Pos()), code)
			}
			return true
		})
	}
	if seen < 20 {
		t.Fatalf("found %d writeError codes: the scan is broken", seen)
	}
}

func callName(call *ast.CallExpr, ok bool) (string, bool) {
	if !ok {
		return "", false
	}
	id, ok := call.Fun.(*ast.Ident)
	if !ok {
		return "", false
	}
	return id.Name, true
}
