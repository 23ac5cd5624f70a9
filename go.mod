module github.com/bdnvol/bdnvol

go 1.26.0

require (
	github.com/alecthomas/kong v1.17.0
	github.com/google/go-containerregistry v0.22.1
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/opencontainers/go-digest v1.0.0
	github.com/opencontainers/image-spec v1.1.1
	golang.org/x/sync v0.25.0
	golang.org/x/term v0.48.0
	gopkg.in/yaml.v3 v3.0.1
	oras.land/oras-go/v2 v2.6.0
)

require golang.org/x/sys v0.50.0 // indirect
