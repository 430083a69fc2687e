package dsoop

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzSealedCheck feeds arbitrary bytes to the checks a library passes before
// the loader sees it: they must answer (a library, or ErrNotALibrary), never
// panic or hang. The seeds, the head of a real ELF file (this test binary) and
// damaged copies of it, run with every `go test`; `make fuzz` explores further.
func FuzzSealedCheck(f *testing.F) {
	f.Add([]byte("\x7fELF"))
	f.Add([]byte("not a library"))
	if exe, err := os.ReadFile("/proc/self/exe"); err == nil && len(exe) > 4096 {
		head := exe[:4096]
		damaged := func(at int, with ...byte) []byte {
			d := append([]byte(nil), head...)
			copy(d[at:], with)
			return d
		}
		f.Add(head[:64])
		f.Add(head)
		f.Add(damaged(32, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)) // e_phoff far past the end
		f.Add(damaged(56, 0xff, 0xff))                                     // e_phnum 65535
		f.Add(damaged(4, 1))                                               // 32-bit class
		f.Add(damaged(5, 2))                                               // big-endian
		f.Add(damaged(16, 3))                                              // ET_DYN: a shared object
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "lib.so")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if s, err := sealLibrary(path); err == nil {
			s.close()
		}
	})
}
