package dsoop_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	t.Run("bytes probed once are not probed again", func(t *testing.T) {
		runs := filepath.Join(t.TempDir(), "runs")
		counting := filepath.Join(t.TempDir(), "probe.sh")
		require.NoError(t, os.WriteFile(counting, []byte("#!/bin/sh\necho run >> "+runs+"\nexec "+
			os.Getenv(dsoop.ProbeEnv)+` "$@"`+"\n"), 0o755))
		t.Setenv(dsoop.ProbeEnv, counting)
		lib := ccLibrary(t, "int __tvm_ffi_probed_once(void) { return "+fmt.Sprint(time.Now().UnixNano()%1000000)+"; }")
		for _, path := range []string{lib, copyLibrary(t, lib)} {
			_, err := dsoop.Probe(path)
			require.NoError(t, err)
		}
		count, err := os.ReadFile(runs)
		require.NoError(t, err)
		assert.Equal(t, "run\n", string(count), "one probe for two copies of one library")
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
