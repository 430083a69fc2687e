package dsoop

import (
	"debug/elf"
	"fmt"
	"io"
	"slices"
	"strings"
)

// levelSymbolPrefix starts the name of each data symbol in which a portable
// library (tf_op.compile's default target) carries the model built for a higher
// x86-64 level: a whole library, with its own CPU flags record, named
// "tvmdsoop_level_x86_64_v3" for the level x86-64-v3
// (python/tf_op_tvm/compile_model.py, levels_source). The library itself is
// the baseline build, BaselineLevel.
const levelSymbolPrefix = "tvmdsoop_level_"

// BaselineLevel names the code of a portable library itself, which any x86-64
// CPU runs.
const BaselineLevel = "x86-64"

// CPULevelEnv caps the level Open loads from a portable library: a level's
// name (x86-64, x86-64-v3, x86-64-v4); unset, the highest this CPU runs.
const CPULevelEnv = "TVMDSOOP_CPU_LEVEL"

// level is one build a portable library embeds.
type level struct {
	name  string            // x86-64-v3
	data  *io.SectionReader // its library's bytes, inside the sealed file
	flags []string          // the CPU flags its library records
}

// readLevels lists the levels the library embeds. Each must be a library whose
// CPU flags can be read: a portable library with one that is not is corrupt.
func readLevels(symbols []elf.Symbol, f *elf.File) ([]level, error) {
	var levels []level
	for _, sym := range symbols {
		suffix, ok := strings.CutPrefix(sym.Name, levelSymbolPrefix)
		if !ok || sym.Section == elf.SHN_UNDEF {
			continue
		}
		name := strings.ReplaceAll(suffix, "_", "-")
		data, err := symbolData(f, sym)
		if err != nil {
			return nil, err
		}
		flags, err := levelFlags(data)
		if err == nil && flags == nil {
			// Without it nothing says which CPUs can run the level's code.
			err = fmt.Errorf("no %s record", cpuFlagsSymbol)
		}
		if err != nil {
			return nil, fmt.Errorf("its level %s: %w", name, err)
		}
		levels = append(levels, level{name: name, data: data, flags: flags})
	}
	return levels, nil
}

// levelFlags reads the CPU flags record of an embedded library.
func levelFlags(data *io.SectionReader) (flags []string, err error) {
	defer func() {
		if r := recover(); r != nil { // a malformed file must not take the process down
			err = fmt.Errorf("malformed ELF (%v)", r)
		}
	}()
	f, err := elf.NewFile(data)
	if err != nil {
		return nil, err
	}
	symbols, err := f.DynamicSymbols()
	if err != nil {
		return nil, fmt.Errorf("dynamic symbols: %v", err)
	}
	return readCPUFlags(f, symbols)
}

// chooseLevel picks the level to load among those a portable library embeds:
// the one with the most CPU flags among those whose flags host has all of, and,
// when limit names a level, whose flags that level's include. None (false)
// means the library's own baseline code: when no level fits, when host is nil
// (this CPU's flags are unknown) or when limit is BaselineLevel. A limit that
// names no level of the library is an error that lists them.
func chooseLevel(levels []level, host map[string]bool, limit string) (level, bool, error) {
	allowed := func(level) bool { return true }
	if limit != "" && limit != BaselineLevel {
		i := slices.IndexFunc(levels, func(l level) bool { return l.name == limit })
		if i < 0 {
			names := []string{BaselineLevel}
			for _, l := range levels {
				names = append(names, l.name)
			}
			return level{}, false, fmt.Errorf("%s=%s names no level this library holds (%s)", CPULevelEnv, limit,
				strings.Join(names, ", "))
		}
		cap := map[string]bool{}
		for _, flag := range levels[i].flags {
			cap[flag] = true
		}
		allowed = func(l level) bool { return len(missingFlags(l.flags, cap)) == 0 }
	}
	if host == nil || limit == BaselineLevel {
		return level{}, false, nil
	}
	var best level
	found := false
	for _, l := range levels {
		if len(missingFlags(l.flags, host)) > 0 || !allowed(l) {
			continue
		}
		if !found || len(l.flags) > len(best.flags) {
			best, found = l, true
		}
	}
	return best, found, nil
}

// atHighestLevel returns the sealed library to load in s's place: the level
// chooseLevel picks, sealed and checked as a file of its own would be, under
// s's digest (the file the user opened and pinned); s itself when it embeds no
// level or none is picked, or with an error. s is closed when another is returned.
func (s *sealedLibrary) atHighestLevel(name string) (*sealedLibrary, error) {
	if len(s.levels) == 0 {
		return s, nil
	}
	chosen, ok, err := chooseLevel(s.levels, hostCPUFlags(), getenv(CPULevelEnv))
	if err != nil || !ok {
		s.level = BaselineLevel
		return s, err
	}
	l, err := seal(name+"@"+chosen.name, io.NewSectionReader(chosen.data, 0, chosen.data.Size()))
	if err != nil {
		return s, fmt.Errorf("its level %s: %w", chosen.name, err)
	}
	l.digest, l.level = s.digest, chosen.name
	s.close()
	return l, nil
}
