package dsoop_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// abortingLibrary aborts in its constructor: loaded here, it would end the process.
const abortingLibrary = `
#include <stdlib.h>
__attribute__((constructor)) static void crash_while_loading(void) { abort(); }
int __tvm_ffi_add_one(void) { return 0; }
`

func TestProbe(t *testing.T) {
	if os.Getenv(dsoop.ProbeEnv) == "" || os.Getenv(dsoop.ProbeEnv) == "off" {
		t.Skipf("%s names no tvmdsoop-probe (make test sets it)", dsoop.ProbeEnv)
	}
	t.Run("a good library gives its digest", func(t *testing.T) {
		path := copyLibrary(t, testLib)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		digest, err := dsoop.Probe(path)
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		assert.Equal(t, hex.EncodeToString(sum[:]), digest)
		assert.False(t, dsoop.Loaded(path), "probed, not loaded here")
	})
	t.Run("a library the probe dies of is refused", func(t *testing.T) {
		_, err := dsoop.Probe(ccLibrary(t, abortingLibrary))
		require.ErrorIs(t, err, dsoop.ErrProbeFailed)
		assert.ErrorContains(t, err, "tvmdsoop-probe ended by aborted")
	})
	t.Run("a missing file", func(t *testing.T) {
		_, err := dsoop.Probe(filepath.Join(t.TempDir(), "missing.so"))
		require.ErrorIs(t, err, fs.ErrNotExist)
	})
	t.Run("not a library", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "text.so")
		require.NoError(t, os.WriteFile(path, []byte("hello, not an ELF file"), 0o644))
		_, err := dsoop.Probe(path)
		require.ErrorIs(t, err, dsoop.ErrNotALibrary)
	})
}
