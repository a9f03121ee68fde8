import Lake
open Lake DSL

/-! KvaLean: Lean 4 statements about RidgeFill (ridge maps, identity fill, causal fill,
exact certificates). Depends on Lean core only (no Mathlib). `lake build` checks every module
under `KvaLean/`; `bash .ci/check-lean` checks the same files without elan/Lake. -/

package kvalean where
  -- every file starts with `module` (the module system, still behind this option in Lean 4.28)
  leanOptions := #[⟨`experimental.module, true⟩]

@[default_target]
lean_lib KvaLean where
  globs := #[.andSubmodules `KvaLean]
