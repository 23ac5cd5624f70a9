package main

// ModelPack models (github.com/modelpack/model-spec) are read wherever a
// version is: the package registers itself with layout.Open.
import _ "github.com/bdnvol/bdnvol/pkg/modelpack"
