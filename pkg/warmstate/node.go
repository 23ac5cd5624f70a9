package warmstate

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// NvidiaSMI returns the key fields of this node's GPUs as nvidia-smi
// (the binary at path, "" for the one in $PATH) reports them: gpu (the
// name, spaces as "-", as GPU feature discovery labels it), cc and driver
// (its major version). GPUs that disagree are an error: one node, one
// kind of GPU per key.
func NvidiaSMI(ctx context.Context, path string) (Key, error) {
	if path == "" {
		path = "nvidia-smi"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nvidia-smi: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	if out.Len() > 64<<10 {
		return nil, fmt.Errorf("nvidia-smi: %d bytes of output", out.Len())
	}
	var k Key
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("nvidia-smi: line %q: want name, compute_cap, driver_version", line)
		}
		name := strings.Join(strings.Fields(f[0]), "-")
		major, _, _ := strings.Cut(strings.TrimSpace(f[2]), ".")
		g, err := NodeFields([]string{FieldGPU + "=" + name, FieldCC + "=" + strings.TrimSpace(f[1]), FieldDriver + "=" + major})
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi: %w", err)
		}
		if k != nil && !k.Equal(g) {
			return nil, fmt.Errorf("nvidia-smi: GPUs differ: %s and %s", k, g)
		}
		k = g
	}
	if k == nil {
		return nil, fmt.Errorf("nvidia-smi: no GPU listed")
	}
	return k, nil
}
