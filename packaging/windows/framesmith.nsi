; Framesmith's Windows installer (NSIS 3, built on Linux by packaging/windows/build.sh, which passes):
;   VERSION  the package version (x.y.z)       STAGE   the staged program folder (framesmith.exe, DLLs, presets, ...)
;   OUTFILE  the installer to write            UNLIST  generated "Delete"/"RMDir" lines for every staged file
; Per-user install without admin rights: %LOCALAPPDATA%\Programs\Framesmith, HKCU registry, the user's Start menu.
; The shortcuts start Framesmith in Documents\Framesmith, so runs and outputs land there; the uninstaller removes
; exactly the files it installed and never that folder.

; A 64-bit installer for a 64-bit program (also what wine64 runs without 32-bit wine).
Target amd64-unicode
!include "MUI2.nsh"
!include "FileFunc.nsh"

!ifndef VERSION | STAGE | OUTFILE | UNLIST
  !error "build with packaging/windows/build.sh (VERSION, STAGE, OUTFILE and UNLIST are required)"
!endif

!define APP "Framesmith"
!define UNINST_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\${APP}"
!define APP_KEY "Software\${APP}"

Name "${APP} ${VERSION}"
OutFile "${OUTFILE}"
RequestExecutionLevel user
InstallDir "$LOCALAPPDATA\Programs\${APP}"
InstallDirRegKey HKCU "${APP_KEY}" "InstallDir"
SetCompressor /SOLID lzma
ManifestDPIAware true
BrandingText "${APP} ${VERSION}"

VIProductVersion "${VERSION}.0"
VIAddVersionKey "ProductName" "${APP}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "FileDescription" "${APP} installer"
VIAddVersionKey "LegalCopyright" "Apache-2.0"

!define MUI_ICON "${STAGE}\assets\framesmith.ico"
!define MUI_UNICON "${STAGE}\assets\framesmith.ico"
!define MUI_ABORTWARNING
!define MUI_COMPONENTSPAGE_NODESC
!define MUI_FINISHPAGE_RUN
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APP}"
!define MUI_FINISHPAGE_RUN_FUNCTION StartApp

!insertmacro MUI_PAGE_WELCOME
!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_DIRECTORY
!insertmacro MUI_PAGE_INSTFILES
!insertmacro MUI_PAGE_FINISH
!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES
!insertmacro MUI_LANGUAGE "English"

Function .onInit
  SetShellVarContext current
FunctionEnd

Function un.onInit
  SetShellVarContext current
FunctionEnd

; The app starts in the user's work folder, as the shortcuts do.
Function StartApp
  SetOutPath "$DOCUMENTS\${APP}"
  Exec '"$INSTDIR\framesmith.exe"'
FunctionEnd

Section "${APP}" SecMain
  SectionIn RO
  SetOutPath "$INSTDIR"
  File /r "${STAGE}\*.*"
  WriteUninstaller "$INSTDIR\uninstall.exe"

  ; The shortcuts' working folder: the demo project, run outputs and samples go there (kept on uninstall).
  CreateDirectory "$DOCUMENTS\${APP}"
  SetOutPath "$DOCUMENTS\${APP}"
  CreateShortcut "$SMPROGRAMS\${APP}.lnk" "$INSTDIR\framesmith.exe" "" "$INSTDIR\assets\framesmith.ico" 0
  SetOutPath "$INSTDIR"

  WriteRegStr HKCU "${APP_KEY}" "InstallDir" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayName" "${APP}"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayVersion" "${VERSION}"
  WriteRegStr HKCU "${UNINST_KEY}" "Publisher" "${APP}"
  WriteRegStr HKCU "${UNINST_KEY}" "DisplayIcon" "$INSTDIR\assets\framesmith.ico"
  WriteRegStr HKCU "${UNINST_KEY}" "InstallLocation" "$INSTDIR"
  WriteRegStr HKCU "${UNINST_KEY}" "UninstallString" '"$INSTDIR\uninstall.exe"'
  WriteRegStr HKCU "${UNINST_KEY}" "QuietUninstallString" '"$INSTDIR\uninstall.exe" /S'
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoModify" 1
  WriteRegDWORD HKCU "${UNINST_KEY}" "NoRepair" 1
  ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
  WriteRegDWORD HKCU "${UNINST_KEY}" "EstimatedSize" $0
SectionEnd

Section "Desktop shortcut" SecDesktop
  SetOutPath "$DOCUMENTS\${APP}"
  CreateShortcut "$DESKTOP\${APP}.lnk" "$INSTDIR\framesmith.exe" "" "$INSTDIR\assets\framesmith.ico" 0
  SetOutPath "$INSTDIR"
SectionEnd

Section "Uninstall"
  ; Exactly the files this installer put there (generated from the staged folder), then the folders if empty:
  ; anything a user saved inside the program folder stays, with the folder.
  !include "${UNLIST}"
  Delete "$INSTDIR\uninstall.exe"
  RMDir "$INSTDIR"
  Delete "$SMPROGRAMS\${APP}.lnk"
  Delete "$DESKTOP\${APP}.lnk"
  DeleteRegKey HKCU "${UNINST_KEY}"
  DeleteRegKey HKCU "${APP_KEY}"
SectionEnd
