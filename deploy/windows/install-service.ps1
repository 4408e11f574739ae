<#
.SYNOPSIS
  Installs the Roost agent as a Windows service (README "Enrol a real machine").
.DESCRIPTION
  Run in an elevated PowerShell from the unpacked win-x64 folder (roost.exe, roost-agent-service.exe,
  roost-agent-service.xml). Copies them to C:\Program Files\Roost, enrols this machine (the token and
  pinned keys go to %ProgramData%\Roost\agent\state, readable only by SYSTEM and Administrators), then
  installs and starts the service "roost-agent" (WinSW), which runs at boot and restarts after a crash.
.EXAMPLE
  .\install-service.ps1 -Api https://roost.example.com -Site site_0123… -Secret ses_… -MachineId $env:COMPUTERNAME
#>
param(
  [Parameter(Mandatory = $true)][string]$Api,
  [Parameter(Mandatory = $true)][string]$Site,
  [Parameter(Mandatory = $true)][string]$Secret,
  [Parameter(Mandatory = $true)][string]$MachineId,
  [string]$InstallDir = "$env:ProgramFiles\Roost"
)
$ErrorActionPreference = 'Stop'
$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) { throw 'Run this script as Administrator.' }

New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
foreach ($f in 'roost.exe', 'roost-agent-service.exe', 'roost-agent-service.xml') { Copy-Item -Force (Join-Path $PSScriptRoot $f) $InstallDir }
$roost = Join-Path $InstallDir 'roost.exe'
$root = Join-Path $env:ProgramData 'Roost\agent'

& $roost agent enrol --api $Api --site $Site --secret $Secret --machine-id $MachineId --root $root
if ($LASTEXITCODE -ne 0) { throw "roost agent enrol failed with exit code $LASTEXITCODE" }

$wrapper = Join-Path $InstallDir 'roost-agent-service.exe'
& $wrapper install
if ($LASTEXITCODE -ne 0) { throw "service install failed with exit code $LASTEXITCODE" }
& $wrapper start
& $roost agent status --root $root
