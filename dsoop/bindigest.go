package dsoop

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

// libraryBinDigestSymbol is the data symbol in which tf_op.compile records the
// SHA-256 of the modules its library serializes (libraryBinSymbol's bytes, all
// of them), as 64 lowercase hex digits and a NUL
// (python/tf_op_tvm/compile_model.py, library_bin_sha256).
const libraryBinDigestSymbol = "tvmdsoop_library_bin_sha256"

// checkLibraryBinDigest refuses a library whose serialized modules (bin) are
// not those it records the digest of, and one whose Relax VM executable has
// functions compiled to native code (TVM's exec_mode="compiled") and records
// none.
//
// The verifier (readVMExecutable) proves that bytecode stays inside the
// register file, constant pool and function table the executable declares. A
// function compiled to native code indexes them with numbers built into its
// machine code, which nothing can read back: a corrupted register count or
// constant pool would have it read and write past them. So the executable
// must be, to the byte, the one its code was compiled with: tf_op.compile
// records its digest in the same library. The digest stops a corrupted file,
// not a hostile author, who can write any native code (docs/security.md).
func checkLibraryBinDigest(f *elf.File, symbols []elf.Symbol, bin *io.SectionReader, modules []embeddedModule) error {
	var native []string
	for _, m := range modules {
		native = append(native, m.nativeFunctions...)
	}
	recorded, err := readLibraryBinDigest(f, symbols)
	switch {
	case err != nil:
		return err
	case recorded == "" && len(native) > 0:
		return fmt.Errorf("its Relax VM executable has functions compiled to native code (%s), which trust the "+
			"executable's tables, and it records no %s to show the executable is the one they were compiled with "+
			"(tf_op.compile records one; a library of TVM's exec_mode=\"compiled\" without it is refused, "+
			"build it with exec_mode=\"bytecode\")", strings.Join(native, ", "), libraryBinDigestSymbol)
	case recorded == "":
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(bin, 0, bin.Size())); err != nil {
		return fmt.Errorf("%s: %v", libraryBinSymbol, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != recorded {
		return fmt.Errorf("its serialized modules (%s) have SHA-256 %s, not the %s it records: the file changed "+
			"after it was built", libraryBinSymbol, got, recorded)
	}
	return nil
}

// readLibraryBinDigest returns the digest the library records in
// libraryBinDigestSymbol; "" when it has none.
func readLibraryBinDigest(f *elf.File, symbols []elf.Symbol) (string, error) {
	raw, err := readRecord(f, symbols, libraryBinDigestSymbol, 2*sha256.Size+1, "a SHA-256 in hex and its NUL")
	if raw == nil || err != nil {
		return "", err
	}
	digest, rest, ended := strings.Cut(string(raw), "\x00")
	if _, err := hex.DecodeString(digest); err != nil || len(digest) != 2*sha256.Size || !ended || rest != "" ||
		strings.ToLower(digest) != digest {
		return "", fmt.Errorf("%s holds %q, not a SHA-256 in lowercase hex and its NUL", libraryBinDigestSymbol, raw)
	}
	return digest, nil
}
