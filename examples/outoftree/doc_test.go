package outoftree

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docPath is the guide whose code blocks quote this module.
const docPath = "../../docs/adding-a-strategy.md"

// fromMarker starts a code block that quotes a file of the repository:
// "// from examples/outoftree/ssicount/ssicount.go", a path from the
// repository's root.
const fromMarker = "// from "

// TestDocQuotesTheCode keeps docs/adding-a-strategy.md and this module
// together: every Go block of the guide must open with a from-marker, and
// every block that has one must be an excerpt of the file it names: its
// non-blank lines appear in that file in the same order (indentation
// aside). A line "// ..." in a block stands for code left out. So the guide
// cannot show a skeleton that does not compile, nor keep one after the code
// it quotes has changed.
func TestDocQuotesTheCode(t *testing.T) {
	blocks := codeBlocks(t, docPath)
	checked := 0
	for _, b := range blocks {
		from, ok := strings.CutPrefix(firstLine(b.lines), fromMarker)
		if !ok {
			if b.lang == "go" {
				t.Errorf("%s:%d: a Go block without %q: quote a real file, so the guide's code compiles", docPath, b.line, fromMarker+"<path>")
			}
			continue
		}
		checked++
		path := strings.TrimSpace(from)
		if !strings.HasPrefix(path, "examples/outoftree/") {
			t.Errorf("%s:%d: %q is not a file of this module; the guide quotes only examples/outoftree", docPath, b.line, path)
			continue
		}
		src, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(path)))
		if err != nil {
			t.Errorf("%s:%d: %v", docPath, b.line, err)
			continue
		}
		if miss, n := excerptOf(b.lines[1:], strings.Split(string(src), "\n")); miss != "" {
			t.Errorf("%s:%d: block line %d is not in %s (in this order): %q\nupdate the guide or the code so that they agree",
				docPath, b.line, n+2, path, miss)
		}
	}
	if checked < 5 {
		t.Errorf("%s: only %d blocks quote this module; the guide's walk-through quotes go.mod, the strategy, its test and the table test", docPath, checked)
	}
}

// excerptOf reports the first line of block, trimmed, that does not appear in
// file after the previous one did, and its index; "" when block is an
// excerpt of file.
func excerptOf(block, file []string) (string, int) {
	at := 0
	for i, l := range block {
		want := strings.TrimSpace(l)
		if want == "" || want == "// ..." {
			continue
		}
		for at < len(file) && strings.TrimSpace(file[at]) != want {
			at++
		}
		if at == len(file) {
			return want, i
		}
		at++
	}
	return "", 0
}

type codeBlock struct {
	lang  string
	line  int // of the opening fence, 1-based
	lines []string
}

// codeBlocks returns the fenced code blocks of a Markdown file.
func codeBlocks(t *testing.T, path string) []codeBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []codeBlock
	var cur *codeBlock
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		l := s.Text()
		fence := strings.HasPrefix(strings.TrimSpace(l), "```")
		switch {
		case cur == nil && fence:
			cur = &codeBlock{lang: strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "```")), line: n}
		case cur != nil && fence:
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: code block never closed", path, cur.line)
	}
	return out
}

func firstLine(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.TrimSpace(lines[0])
}

// TestExcerptOfCatchesDrift: the check fails on a changed line, on lines out
// of order, and passes over blank lines and "// ..." elisions.
func TestExcerptOfCatchesDrift(t *testing.T) {
	file := strings.Split("func F() {\n\ta := 1\n\tb := 2\n\treturn\n}", "\n")
	for _, c := range []struct {
		block string
		ok    bool
	}{
		{"func F() {\n    a := 1\n\n// ...\nreturn\n}", true},
		{"func F() {\n\ta := 2\n}", false},
		{"b := 2\na := 1", false},
	} {
		miss, _ := excerptOf(strings.Split(c.block, "\n"), file)
		if (miss == "") != c.ok {
			t.Errorf("excerptOf(%q): missing %q, want ok=%v", c.block, miss, c.ok)
		}
	}
}
