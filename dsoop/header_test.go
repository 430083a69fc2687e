package dsoop_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeaderTakesTheVendoredDLPack: dsoop.h gets the vendored dlpack.h even
// where another copy comes first on the include path (cgo puts CGO_CFLAGS, with
// TensorFlow's include folder, before the #cgo folders), and refuses to compile
// where another copy was included before it.
func TestHeaderTakesTheVendoredDLPack(t *testing.T) {
	cc, err := exec.Command("go", "env", "CC").Output()
	require.NoError(t, err)
	decoy := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(decoy, "dlpack"), 0o755))
	// Another DLPack, as copies are guarded: its types missing, so that using it fails too.
	require.NoError(t, os.WriteFile(filepath.Join(decoy, "dlpack", "dlpack.h"), []byte(
		"#ifndef DLPACK_DLPACK_H_\n#define DLPACK_DLPACK_H_\n#define DLPACK_MAJOR_VERSION 1\n#define DLPACK_MINOR_VERSION 1\n#endif\n"), 0o644))
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	tests := []struct {
		name    string
		source  string
		wantErr string // "" when it compiles
	}{
		{"another copy first on the include path", `#include "dsoop/dsoop.h"`, ""},
		{"another copy included first", "#include <dlpack/dlpack.h>\n#include \"dsoop/dsoop.h\"", "other than the vendored one"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(strings.TrimSpace(string(cc)), "-fsyntax-only", "-x", "c", "-I", decoy, "-I", root,
				"-I", filepath.Join(root, "third_party", "tvm-ffi", "include"), "-")
			cmd.Stdin = strings.NewReader(tc.source + "\n")
			out, err := cmd.CombinedOutput()
			if tc.wantErr == "" {
				assert.NoError(t, err, "%s", out)
				return
			}
			assert.Error(t, err)
			assert.Contains(t, string(out), tc.wantErr)
		})
	}
}
