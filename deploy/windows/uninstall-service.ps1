<#
.SYNOPSIS
  Stops and removes the Roost agent service. The state folder (%ProgramData%\Roost\agent) is kept unless
  -RemoveState is given (it holds the agent token and the extracted roosts).
#>
param([string]$InstallDir = "$env:ProgramFiles\Roost", [switch]$RemoveState)
$ErrorActionPreference = 'Stop'
$wrapper = Join-Path $InstallDir 'roost-agent-service.exe'
& $wrapper stop
& $wrapper uninstall
if ($RemoveState) { Remove-Item -Recurse -Force (Join-Path $env:ProgramData 'Roost\agent') }
