package criu_test

import "github.com/arbor-env/arbor/sandbox/initd"

var initdPrepareDev = initd.PrepareDev
