-- The planted escapes of the source scan that Lean's lexer reads differently from a line-by-line regular
-- expression: `crossval/test_lean_checker.py` plants each block (from one `-- plant:` line to the next)
-- alone just before `end KvaLean` in a copy of `KvaLean/Ridge.lean`, and all of them at once for one run
-- of `bash .ci/check-lean`; the scan must report each on its line. Not a module: never built.

-- plant: axiom glued to ⟨⟩ (a keyword after a non-ASCII character is still a keyword)
theorem t : True := ⟨⟩axiom cheat : (1 : Nat) = 2

-- plant: interpolation with a space before the quote
theorem t1 : (s! "{(by native_decide : 2 + 2 = 4)}").length = 4 := rfl

-- plant: #eval! (code run at elaboration time)
#eval! (pure () : IO Unit)

-- plant: run_cmd glued to ⟨⟩
theorem t0 : True := ⟨⟩run_cmd pure ()
