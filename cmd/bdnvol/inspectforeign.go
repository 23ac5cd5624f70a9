package main

import (
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// foreignName names a foreign artifact type for people.
func foreignName(artifactType string) string {
	switch artifactType {
	case modelpack.ArtifactType, modelpack.MediaTypeConfig, modelpack.LegacyArtifactType, modelpack.LegacyMediaTypeConfig:
		return "modelpack"
	}
	return termsafe.Short(artifactType)
}

// countDirs counts the directories of d's files.
func countDirs(d *versions.Details) int {
	n := 0
	for f := range d.Files.All() {
		if f.Type == layout.TypeDir {
			n++
		}
	}
	return n
}

// streamedList lists the streamed files, or says there are none.
func streamedList(ps []string) string {
	if len(ps) == 0 {
		return "none"
	}
	return strings.Join(termsafe.Names(ps), " ")
}
