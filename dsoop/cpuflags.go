package dsoop

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// cpuFlagsSymbol is the data symbol in which tf_op.compile records the CPU
// features its library's code uses: a NUL-terminated, space-separated list of
// flag names as Linux's /proc/cpuinfo spells them ("avx2 fma"). Libraries built
// otherwise do not carry it, and nothing is checked for them.
const cpuFlagsSymbol = "tvmdsoop_cpu_flags"

// maxCPUFlagsSize bounds what is read of the symbol: a list of flag names.
const maxCPUFlagsSize = 4096

// readCPUFlags returns the flags the library records in cpuFlagsSymbol; nil
// when it has none.
func readCPUFlags(f *elf.File, symbols []elf.Symbol) ([]string, error) {
	raw, err := readRecord(f, symbols, cpuFlagsSymbol, maxCPUFlagsSize, "a list of CPU flags")
	if raw == nil || err != nil {
		return nil, err
	}
	text, _, _ := strings.Cut(string(raw), "\x00")
	return strings.Fields(text), nil
}

// readRecord returns the bytes of the data symbol name, a record the library
// keeps of itself (what it is: say when over maxSize bytes); nil when the
// library does not define it.
func readRecord(f *elf.File, symbols []elf.Symbol, name string, maxSize uint64, what string) ([]byte, error) {
	for _, sym := range symbols {
		if sym.Name != name || sym.Section == elf.SHN_UNDEF {
			continue
		}
		if sym.Size > maxSize {
			return nil, fmt.Errorf("%s is %d bytes, more than %s", name, sym.Size, what)
		}
		data, err := symbolData(f, sym)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		return raw, nil
	}
	return nil, nil
}

// symbolData is the contents of a data symbol defined in the file, checked to
// lie inside its section's bytes.
func symbolData(f *elf.File, sym elf.Symbol) (*io.SectionReader, error) {
	if int(sym.Section) >= len(f.Sections) {
		return nil, fmt.Errorf("%s is in section %d of %d", sym.Name, sym.Section, len(f.Sections))
	}
	sec := f.Sections[sym.Section]
	if sec.Type != elf.SHT_PROGBITS || sym.Value < sec.Addr || sym.Value-sec.Addr > sec.Size || sym.Size > sec.Size-(sym.Value-sec.Addr) {
		return nil, fmt.Errorf("%s lies outside its section's contents", sym.Name)
	}
	return io.NewSectionReader(sec, int64(sym.Value-sec.Addr), int64(sym.Size)), nil
}

// checkCPUFlags refuses a library whose recorded flags are not all among this
// CPU's (ErrUnsupportedCPU). When this CPU's flags cannot be read, there is
// nothing to check against and the library is let through.
func checkCPUFlags(needed []string) error {
	host := hostCPUFlags()
	if len(needed) == 0 || host == nil {
		return nil
	}
	if missing := missingFlags(needed, host); len(missing) > 0 {
		return fmt.Errorf("%w: it uses %s, which this CPU does not have (it was compiled for another CPU: "+
			"compile it again for a target this CPU has, such as tf_op.compile's default)",
			ErrUnsupportedCPU, strings.Join(missing, " "))
	}
	return nil
}

// missingFlags lists the needed flags host lacks, in needed's order.
func missingFlags(needed []string, host map[string]bool) []string {
	var missing []string
	for _, flag := range needed {
		if !host[flag] {
			missing = append(missing, flag)
		}
	}
	return missing
}

// hostCPUFlags is the "flags" line of /proc/cpuinfo (the features the kernel
// found and enabled, AVX state included), read once; nil when there is none.
var hostCPUFlags = sync.OnceValue(func() map[string]bool {
	file, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	defer file.Close()
	return parseCPUFlags(file)
})

// parseCPUFlags reads the first "flags" line of a /proc/cpuinfo; nil without one.
func parseCPUFlags(cpuinfo io.Reader) map[string]bool {
	lines := bufio.NewScanner(cpuinfo)
	lines.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for lines.Scan() {
		key, value, ok := strings.Cut(lines.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		flags := map[string]bool{}
		for _, flag := range strings.Fields(value) {
			flags[flag] = true
		}
		return flags
	}
	return nil
}
