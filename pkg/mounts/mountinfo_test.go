package mounts

import (
	"strings"
	"testing"
)

const sampleMountinfo = `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:30 / /mnt/plain rw,nosuid,nodev,relatime shared:20 - fuse.bdnvol bdnvol@sha256:aaaa rw,user_id=0,group_id=0
36 22 0:31 / /mnt/with\040space\011tab\134back rw,nosuid - fuse.bdnvol bdnvol@sha256:bbbb rw,user_id=0
37 22 0:32 / /mnt/other rw - fuse.sshfs host:/x rw
38 22 0:30 / /var/lib/kubelet/pods/p1/volumes/v rw,nosuid master:20 unbindable - fuse.bdnvol bdnvol@sha256:aaaa rw
39 22 0:33 / /mnt/new\012line rw - fuse.bdnvol bdnvol@sha256:cccc rw
garbage line
40 22 0:34 / /mnt/short rw - fuse.bdnvol
`

func TestParseMountinfo(t *testing.T) {
	got, err := ParseMountinfo(strings.NewReader(sampleMountinfo))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{"/mnt/plain", "sha256:aaaa"},
		{"/mnt/with space\ttab\\back", "sha256:bbbb"},
		{"/var/lib/kubelet/pods/p1/volumes/v", "sha256:aaaa"},
		{"/mnt/new\nline", "sha256:cccc"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mounts %q, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mount %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:        "plain",
		`a\040b`:       "a b",
		`\134`:         `\`,
		`trail\04`:     `trail\04`, // too short to be an escape
		`bad\999x`:     `bad\999x`, // not octal
		`\101\102\103`: "ABC",
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
