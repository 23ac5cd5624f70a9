package signature

import (
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestRepoName(t *testing.T) {
	for s, want := range map[string]string{
		"r.example:5000/org/vol:v1": "r.example:5000/org/vol",
		"r.example/vol@sha256:" + "0000000000000000000000000000000000000000000000000000000000000000": "r.example/vol",
		"oci:/data/vol:v1": "oci:/data/vol",
	} {
		ref, err := oci.ParseRef(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := RepoName(ref); got != want {
			t.Errorf("RepoName(%s) = %s, want %s", s, got, want)
		}
	}
}
