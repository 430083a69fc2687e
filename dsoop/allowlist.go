package dsoop

import (
	"fmt"
	"path/filepath"
	"strings"
)

// AllowedDirsEnv names the environment variable that, when set, lists (separated
// by ':') the only folders libraries may be loaded from. Loading a library runs
// its code: this keeps a model from loading one from anywhere else.
const AllowedDirsEnv = "TVMDSOOP_ALLOWED_DIRS"

// checkAllowed refuses a library outside the folders of allowed (':'-separated);
// an empty allowed permits every folder. Symbolic links are resolved first, so a
// link inside an allowed folder cannot point outside it.
func checkAllowed(path, allowed string) error {
	if allowed == "" {
		return nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("dsoop: library %s: %w", path, err)
	}
	for _, dir := range filepath.SplitList(allowed) {
		if dir == "" {
			continue
		}
		// Relative to what? The working directory of a server is no policy.
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("dsoop: %w: %s=%s holds %q, which is not an absolute path", ErrNotAllowed, AllowedDirsEnv, allowed, dir)
		}
		realDir, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue // a folder that does not exist allows nothing
		}
		if rel, err := filepath.Rel(realDir, real); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil
		}
	}
	return fmt.Errorf("dsoop: %w: %s is not in %s=%s", ErrNotAllowed, real, AllowedDirsEnv, allowed)
}
