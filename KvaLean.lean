module

public import KvaLean.LinAlg
public import KvaLean.Ridge
public import KvaLean.Identity
public import KvaLean.Solve
public import KvaLean.Causality
public import KvaLean.Stability
public import KvaLean.Rope
public import KvaLean.Certificate
public import KvaLean.CertExamples
public import KvaLean.Masked
public import KvaLean.GramCert
