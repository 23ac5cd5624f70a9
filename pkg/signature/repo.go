package signature

import "github.com/bdnvol/bdnvol/pkg/oci"

// RepoName is the name a signature payload gives the repository ref names:
// HOST/REPO, or oci:PATH for a layout.
func RepoName(ref oci.Ref) string {
	if ref.Layout != "" {
		return ref.Repo()
	}
	return ref.Registry + "/" + ref.Repository
}
