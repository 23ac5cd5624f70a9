package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// deploymentYAML is a Kubernetes Deployment with comments, quoting styles
// and a flow mapping; REPO stands for the volume repository.
const deploymentYAML = `# llama inference server
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llama        # keep in sync with the Service
  labels: {app: llama, tier: "inference"}
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: server
          image: nginx:1.27   # not a volume
          args: ["--model", "/models/llama"]
          volumeMounts:
            - {name: weights, mountPath: /models/llama, readOnly: true}
      volumes:
        - name: weights
          image:
            # the model data revision
            reference: REPO:prod
            pullPolicy: IfNotPresent
        - name: tokenizer
          image: {reference: "REPO:v1", pullPolicy: IfNotPresent}
`

const bdnvolYAML = `# deploy file
mounts:
  - source: REPO:prod    # weights
    path: /models/llama
    readOnly: true
`

func TestPinAndLint(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		const name = "team/llama"
		repo := tg.repo(name)
		dirs := llamaTrees(t)
		v1 := pushJSON(t, repo+":v1", dirs[0], smallChunks...)
		v2 := pushJSON(t, repo+":v2", dirs[1], append([]string{"--tag", "prod"}, smallChunks...)...)
		work := t.TempDir()

		// pin --all on a Kubernetes Deployment: byte for byte the same but
		// for the pinned strings; lint --all is then clean.
		k8s := filepath.Join(work, "deployment.yaml")
		orig := strings.ReplaceAll(deploymentYAML, "REPO", repo)
		mustWrite(t, k8s, []byte(orig))
		check := mustRun(t, "pin", "--check", "--all", k8s)
		if string(fileContents(t, k8s)) != orig {
			t.Fatalf("pin --check wrote the file")
		}
		if strings.Count(check.stdout, "\n") != 2 || !strings.Contains(check.stdout, k8s+":21: ") || !strings.Contains(check.stdout, k8s+":24: ") {
			t.Fatalf("pin --check should list the two changes with file:line:\n%s", check)
		}
		mustRun(t, "pin", "--all", k8s)
		want := strings.NewReplacer(
			"reference: "+repo+":prod\n", "reference: "+repo+":prod@"+v2.Digest+"\n",
			`"`+repo+`:v1"`, `"`+repo+":v1@"+v1.Digest+`"`,
		).Replace(orig)
		if got := string(fileContents(t, k8s)); got != want {
			t.Fatalf("pinned Deployment differs from the original beyond the pinned strings:\n--- got\n%s--- want\n%s", got, want)
		}
		if r := run(t, "lint", "--all", k8s); r.code != 0 {
			t.Fatalf("lint of the pinned Deployment should pass:\n%s", r)
		}
		if r := mustRun(t, "pin", "--all", k8s); r.stdout != "" || string(fileContents(t, k8s)) != want {
			t.Fatalf("pinning a pinned file changed it:\n%s", r)
		}

		// bdnvol.yaml: an unpinned source fails lint with file:line.
		spec := filepath.Join(work, "bdnvol.yaml")
		mustWrite(t, spec, []byte(strings.ReplaceAll(bdnvolYAML, "REPO", repo)))
		r := run(t, "lint", spec)
		if r.code != 1 || !strings.Contains(r.stdout, spec+":3: "+repo+":prod: not pinned") {
			t.Fatalf("lint of an unpinned source should exit 1 naming file:line, reference and reason:\n%s", r)
		}
		mustRun(t, "pin", spec)
		pinned := strings.ReplaceAll(bdnvolYAML, "REPO:prod", repo+":prod@"+v2.Digest)
		if string(fileContents(t, spec)) != pinned {
			t.Fatalf("pinned bdnvol.yaml:\n%s", fileContents(t, spec))
		}
		mustRun(t, "lint", spec)

		// prod moves (a rollback to v1): lint says so.
		mustRun(t, "tag", repo+":v1", "prod")
		r = run(t, "lint", spec)
		if r.code != 1 || !strings.Contains(r.stdout, "prod moved since this was pinned") || !strings.Contains(r.stdout, v1.Digest) {
			t.Fatalf("lint after prod moved:\n%s", r)
		}
		// pin --update follows the tag.
		mustRun(t, "pin", "--update", spec)
		if !strings.Contains(string(fileContents(t, spec)), repo+":prod@"+v1.Digest+"    # weights") {
			t.Fatalf("pin --update:\n%s", fileContents(t, spec))
		}
		mustRun(t, "lint", spec)

		// The pinned digest is deleted: lint fails, in both files.
		deleteVersion(t, tg, name, v1.Digest)
		r = run(t, "lint", spec)
		if r.code != 1 || !strings.Contains(r.stdout, spec+":3: ") || !strings.Contains(r.stdout, "does not exist") {
			t.Fatalf("lint of a deleted digest should exit 1:\n%s", r)
		}
		r = run(t, "lint", "--all", k8s)
		if r.code != 1 || !strings.Contains(r.stdout, k8s+":24: ") || strings.Contains(r.stdout, k8s+":21: ") {
			t.Fatalf("lint --all of the Deployment after v1 was deleted should flag line 24 only:\n%s", r)
		}
	})
}
