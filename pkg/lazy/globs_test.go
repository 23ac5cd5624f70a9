package lazy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseGlobsBounds(t *testing.T) {
	many := func(n int) string {
		var ps []string
		for i := range n {
			ps = append(ps, fmt.Sprintf("*.x%d", i))
		}
		return strings.Join(ps, ",")
	}
	if _, err := ParseGlobs(many(MaxGlobs)); err != nil {
		t.Errorf("%d patterns: %v", MaxGlobs, err)
	}
	for name, s := range map[string]string{
		"too many":  many(MaxGlobs + 1),
		"too long":  "*" + strings.Repeat("a", MaxGlobBytes),
		"malformed": "[[",
		"huge":      strings.Repeat(",", 1<<20),
	} {
		_, err := ParseGlobs(s)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if len(err.Error()) > 256 {
			t.Errorf("%s: error of %d bytes echoes the input", name, len(err.Error()))
		}
	}
}

func TestGlobsMatch(t *testing.T) {
	g, err := ParseGlobs("*.json, sub/*, exact.txt, *.json")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"config.json": true, "deep/dir/config.json": true, "sub/small.txt": true, "sub/deeper/x": false,
		"exact.txt": true, "dir/exact.txt": true, "big.bin": false, "exact.txt2": false,
	} {
		if got := g.Match(name); got != want {
			t.Errorf("Match(%q) = %v, want %v", name, got, want)
		}
	}
	if err := g.Err(); err != nil {
		t.Errorf("Err after cheap matches: %v", err)
	}
}

// TestGlobsBudget: the costliest patterns allowed stop matching within
// their budget instead of taking minutes, and say so; cheap patterns on
// many paths never run out.
func TestGlobsBudget(t *testing.T) {
	var ps []string
	for i := range MaxGlobs {
		ps = append(ps, "*"+strings.Repeat("a", MaxGlobBytes-5)+fmt.Sprintf("%04d", i))
	}
	g, err := ParseGlobs(strings.Join(ps, ","))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("a", 250)
	start := time.Now()
	for i := range 3000 {
		g.Match(fmt.Sprintf("d/%s%d", name, i))
	}
	took := time.Since(start)
	if !errors.Is(g.Err(), ErrGlobBudget) {
		t.Errorf("Err = %v, want ErrGlobBudget", g.Err())
	}
	if took > 5*time.Second {
		t.Errorf("3000 paths took %v", took)
	}
	t.Logf("3000 paths against %d costly patterns: %v", MaxGlobs, took)

	cheap, _ := ParseGlobs("*.json,*.safetensors,tokenizer*,sub/*.txt")
	for i := range 200_000 {
		cheap.Match(fmt.Sprintf("data/shard-%06d/part-%06d.safetensors", i/1000, i))
	}
	if err := cheap.Err(); err != nil {
		t.Errorf("cheap patterns on 200000 paths: %v", err)
	}
}
